//! Driver errors as [`StoreError`]s: transient ones (retrying may help) are
//! [`StoreError::Database`], permanent ones (the server refuses and will refuse again)
//! [`StoreError::Rejected`].
//!
//! Transient: network and I/O errors, a cleared connection pool, no server selectable, a
//! DNS failure, any error the driver or server labels retryable (`RetryableWriteError`,
//! `TransientTransactionError`, `RetryableError`, `SystemOverloadedError`), and server
//! codes of a node that is stepping down, shutting down, not primary, or timed out
//! ([`TRANSIENT_CODES`]). Everything else is permanent: an authentication failure, not
//! authorized (13), a document too large (10334, 17419, 17420 and the driver's own size
//! check), a document failing validation (121), a bad value (2), a failed BSON
//! serialisation, an invalid argument.

use mongodb::error::{
    Error, ErrorKind, WriteFailure, RETRYABLE_ERROR, RETRYABLE_WRITE_ERROR, SYSTEM_OVERLOADED_ERROR,
    TRANSIENT_TRANSACTION_ERROR,
};

use super::gridfs::{self, GridFsError};
use crate::store::StoreError;

/// The MongoDB duplicate-key error code.
pub(super) const DUPLICATE_KEY: i32 = 11000;

/// Error labels that say retrying may succeed.
const TRANSIENT_LABELS: [&str; 4] = [
    RETRYABLE_WRITE_ERROR,
    TRANSIENT_TRANSACTION_ERROR,
    RETRYABLE_ERROR,
    SYSTEM_OVERLOADED_ERROR,
];

/// Server error codes that pass: HostUnreachable (6), HostNotFound (7), MaxTimeMSExpired
/// (50), WriteConcernFailed (64, a write concern timeout), NetworkTimeout (89),
/// ShutdownInProgress (91), WriteConflict (112), ReadConcernMajorityNotAvailableYet (134),
/// PrimarySteppedDown (189), ExceededTimeLimit (262), ReauthenticationRequired (391),
/// SocketException (9001), LegacyNotPrimary (10058), NotWritablePrimary (10107),
/// InterruptedAtShutdown (11600), InterruptedDueToReplStateChange (11602),
/// NotPrimaryNoSecondaryOk (13435), NotPrimaryOrSecondary (13436).
pub(crate) const TRANSIENT_CODES: [i32; 18] = [
    6, 7, 50, 64, 89, 91, 112, 134, 189, 262, 391, 9001, 10058, 10107, 11600, 11602, 13435, 13436,
];

/// Whether retrying the operation that failed with `e` may succeed.
pub(crate) fn is_transient(e: &Error) -> bool {
    if TRANSIENT_LABELS.iter().any(|l| e.contains_label(l)) {
        return true;
    }
    let code = |c: i32| TRANSIENT_CODES.contains(&c);
    match e.kind.as_ref() {
        ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::DnsResolve { .. } => true,
        ErrorKind::Command(c) => code(c.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => code(w.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => code(w.code),
        ErrorKind::InsertMany(m) => {
            let concern = m.write_concern_error.as_ref().map(|w| code(w.code));
            let writes = m
                .write_errors
                .as_ref()
                .filter(|errs| !errs.is_empty())
                .map(|errs| errs.iter().all(|w| code(w.code)));
            match (concern, writes) {
                (None, None) => false,
                (c, w) => c.unwrap_or(true) && w.unwrap_or(true),
            }
        }
        _ => false,
    }
}

/// A driver error as a store error, saying what was being done and whether retrying can
/// help.
pub(crate) fn classify(op: &str, e: &Error) -> StoreError {
    let message = format!("{op}: {e}");
    if is_transient(e) {
        StoreError::Database(message)
    } else {
        StoreError::Rejected(message)
    }
}

/// A driver error as a store error, saying what was being done (for `map_err`).
pub(super) fn db_err(op: &'static str) -> impl Fn(Error) -> StoreError {
    move |e| classify(op, &e)
}

/// Whether every failure in `e` is a duplicate-key error.
pub(super) fn is_duplicate_key(e: &Error) -> bool {
    match e.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == DUPLICATE_KEY,
        ErrorKind::Command(c) => c.code == DUPLICATE_KEY,
        ErrorKind::InsertMany(m) => {
            m.write_concern_error.is_none()
                && m.write_errors
                    .as_ref()
                    .is_some_and(|errs| errs.iter().all(|w| w.code == DUPLICATE_KEY))
        }
        _ => false,
    }
}

impl From<GridFsError> for StoreError {
    fn from(e: GridFsError) -> Self {
        match e {
            GridFsError::NotFound(id) => StoreError::Malformed {
                collection: gridfs::FILES,
                id: id.to_hex(),
                reason: "no such file".to_string(),
            },
            GridFsError::Corrupt { file_id, reason } => StoreError::Malformed {
                collection: gridfs::FILES,
                id: file_id.to_hex(),
                reason,
            },
            GridFsError::Database { op, file_id, source } => {
                classify(&format!("GridFS {op} of file {file_id}"), &source)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use mongodb::error::{CommandError, WriteConcernError, WriteError};

    fn command(code: i32) -> Error {
        let c: CommandError = bson::from_document(doc! { "code": code, "codeName": "X", "errmsg": "refused" }).unwrap();
        Error::from(ErrorKind::Command(c))
    }

    fn write(code: i32) -> Error {
        let w: WriteError = bson::from_document(doc! { "code": code, "errmsg": "refused" }).unwrap();
        Error::from(ErrorKind::Write(WriteFailure::WriteError(w)))
    }

    fn concern(code: i32) -> Error {
        let w: WriteConcernError =
            bson::from_document(doc! { "code": code, "codeName": "X", "errmsg": "timeout" }).unwrap();
        Error::from(ErrorKind::Write(WriteFailure::WriteConcernError(w)))
    }

    #[test]
    fn network_errors_and_elections_are_transient() {
        let io = Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(is_transient(&io));
        let timeout = Error::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(is_transient(&timeout));
        for code in [10107, 13435, 11600, 11602, 189, 91, 89, 9001, 50, 262] {
            assert!(is_transient(&command(code)), "command code {code}");
            assert!(is_transient(&write(code)), "write code {code}");
        }
        assert!(is_transient(&concern(64)), "write concern timeout");
        assert!(matches!(classify("finish task", &io), StoreError::Database(_)));
    }

    #[test]
    fn refusals_are_permanent() {
        // Unauthorized, BadValue, DocumentValidationFailure, BSONObjectTooLarge, the
        // update's "document too large", duplicate key, an unknown code.
        for code in [13, 2, 121, 10334, 17419, 17420, DUPLICATE_KEY, 99999] {
            assert!(!is_transient(&command(code)), "command code {code}");
            assert!(!is_transient(&write(code)), "write code {code}");
        }
        assert!(!is_transient(&concern(100)), "unsatisfiable write concern");
        let e = classify("finish task", &write(121));
        assert!(
            matches!(&e, StoreError::Rejected(m) if m.starts_with("finish task: ")),
            "{e}"
        );
        assert!(!e.is_transient());
        assert!(e.to_string().contains("retrying cannot help"), "{e}");
    }

    #[test]
    fn gridfs_errors_keep_their_class() {
        let id = bson::oid::ObjectId::new();
        let lost = GridFsError::Database {
            op: "write",
            file_id: id,
            source: Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        };
        assert!(StoreError::from(lost).is_transient());
        let refused = GridFsError::Database {
            op: "write",
            file_id: id,
            source: command(13),
        };
        let e = StoreError::from(refused);
        assert!(!e.is_transient());
        assert!(e.to_string().contains(&id.to_hex()), "{e}");
    }
}
