//! Kernel pseudo-filesystems are out of every grant.
//!
//! procfs, sysfs, devtmpfs and their kin are windows into the host, not storage: through
//! a grant of `/proc` a plugin would read the DEN's environment (`/proc/self/environ`: the
//! API token, the database credentials) and memory (`/proc/self/mem`, a regular file), and
//! with `:rw` write into it. They are recognised by filesystem type, never by path, twice:
//!
//! - when a grant is checked ([`grant_problem`]): a directory that is on such a filesystem
//!   or holds a mount of one (read from `/proc/self/mountinfo`; granting `/` holds `/proc`)
//!   is refused;
//! - on every open ([`of_fd`], one `fstatfs` of the opened descriptor): a file or directory
//!   on such a filesystem is closed again and the open fails with `access`, so a bind mount
//!   or a mount that appears inside a grant after its check is still out of reach.
//!
//! devtmpfs reports the `f_type` of tmpfs, so on open it cannot be told from `/tmp`; its
//! device nodes are refused as special files (see [`super::special`]) and a grant of it is
//! refused by its mount's type name.

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The kernel filesystems no grant may reach: the type name `/proc/self/mountinfo` gives,
/// and the `statfs` `f_type` magic number (linux/magic.h), where it has its own.
const KERNEL_FILESYSTEMS: &[(&str, Option<u32>)] = &[
    ("proc", Some(0x9fa0)),
    ("sysfs", Some(0x6265_6572)),
    ("devtmpfs", None),
    ("devpts", Some(0x1cd1)),
    ("debugfs", Some(0x6462_6720)),
    ("tracefs", Some(0x7472_6163)),
    ("securityfs", Some(0x7363_6673)),
    ("cgroup", Some(0x0027_e0eb)),
    ("cgroup2", Some(0x6367_7270)),
    ("bpf", Some(0xcafe_4a11)),
    ("configfs", Some(0x6265_6570)),
    ("efivarfs", Some(0xde5e_81e4)),
    ("pstore", Some(0x6165_676c)),
    ("binfmt_misc", Some(0x4249_4e4d)),
    ("selinuxfs", Some(0xf97c_ff8c)),
    ("smackfs", Some(0x4341_5d53)),
    ("nsfs", Some(0x6e73_6673)),
    ("fusectl", Some(0x6573_5543)),
    ("mqueue", Some(0x1980_0202)),
];

/// The kernel filesystem of `statfs` type `f_type`, if it is one.
fn by_magic(f_type: u32) -> Option<&'static str> {
    KERNEL_FILESYSTEMS
        .iter()
        .find(|(_, magic)| *magic == Some(f_type))
        .map(|(name, _)| *name)
}

/// The kernel filesystem of mount type `name`, if it is one.
fn by_name(name: &str) -> Option<&'static str> {
    KERNEL_FILESYSTEMS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(name, _)| *name)
}

/// The kernel filesystem the open descriptor `fd` is on, if any; `Err` when it cannot be
/// told (then the caller refuses).
pub(crate) fn of_fd(fd: BorrowedFd<'_>) -> std::io::Result<Option<&'static str>> {
    let mut buf = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `fd` is an open descriptor and `buf` is valid for fstatfs to fill.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), buf.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so it filled `buf`.
    let f_type = unsafe { buf.assume_init() }.f_type;
    // Some magic numbers have the high bit set: compare the 32 bits the kernel defines.
    Ok(by_magic(f_type as u32))
}

/// The kernel filesystem the directory `path` is on, if any (following symlinks, as the
/// preopen does).
pub(crate) fn of_path(path: &Path) -> std::io::Result<Option<&'static str>> {
    let dir = std::fs::File::open(path)?;
    of_fd(std::os::fd::AsFd::as_fd(&dir))
}

/// One line of `/proc/self/mountinfo`: mount point and filesystem type.
fn parse_mount(line: &str) -> Option<(PathBuf, String)> {
    let mut fields = line.split(' ');
    let mount_point = fields.nth(4)?;
    let fstype = fields.skip_while(|f| *f != "-").nth(1)?;
    Some((
        PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(mount_point))),
        fstype.to_owned(),
    ))
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Why a grant of host directory `host` reaches a kernel filesystem, if it does: it is on
/// one, or one is mounted at or below it. Mounts are those of this process's namespace.
pub(crate) fn grant_problem(host: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(host).unwrap_or_else(|_| host.to_owned());
    // A directory that cannot be opened is refused where it is opened; the check of every
    // open remains.
    if let Ok(Some(fs)) = of_path(&dir) {
        return Some(format!("it is on a kernel filesystem ({fs})"));
    }
    let mounts = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => text.lines().filter_map(parse_mount).collect::<Vec<_>>(),
        // Without procfs there is no mount table to read: the check on every open remains.
        Err(_) => return None,
    };
    // The mount `dir` is on: the deepest mount point above it, the last of equals.
    let on =
        mounts
            .iter()
            .filter(|(at, _)| dir.starts_with(at))
            .fold(None::<&(PathBuf, String)>, |best, m| match best {
                Some(b) if b.0.components().count() > m.0.components().count() => Some(b),
                _ => Some(m),
            });
    if let Some((at, fs)) = on.and_then(|(at, t)| by_name(t).map(|fs| (at, fs))) {
        return Some(format!(
            "it is on a kernel filesystem ({fs}, mounted at {})",
            at.display()
        ));
    }
    mounts
        .iter()
        .filter(|(at, _)| at.starts_with(&dir) && *at != dir)
        .find_map(|(at, t)| by_name(t).map(|fs| (at, fs)))
        .map(|(at, fs)| format!("it holds a kernel filesystem ({fs}) mounted at {}", at.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes() {
        let line = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - proc proc rw";
        assert_eq!(parse_mount(line), Some((PathBuf::from("/mnt/a b"), "proc".into())));
        let line = "22 1 0:5 / /dev rw shared:2 - devtmpfs udev rw,size=1k";
        assert_eq!(by_name(&parse_mount(line).unwrap().1), Some("devtmpfs"));
        assert_eq!(by_name("ext4"), None);
    }

    #[test]
    fn magic_numbers_name_their_filesystem() {
        assert_eq!(by_magic(0x9fa0), Some("proc"));
        assert_eq!(by_magic(0xcafe_4a11), Some("bpf"));
        assert_eq!(by_magic(0x0102_1994), None, "tmpfs is storage");
    }

    #[test]
    fn proc_and_root_are_refused_a_temporary_directory_is_not() {
        assert!(grant_problem(Path::new("/proc")).unwrap().contains("proc"));
        assert!(grant_problem(Path::new("/proc/self")).unwrap().contains("proc"));
        assert!(grant_problem(Path::new("/")).unwrap().contains("/proc"));
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(grant_problem(tmp.path()), None);
    }
}
