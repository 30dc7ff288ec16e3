//! GridFS files of task output with **String** chunks, the way Disbatch 4 stores them.
//!
//! Files live in the `tasks.files` / `tasks.chunks` buckets. A file document is
//! `{_id, filename, metadata: {task_id}, chunkSize: 261120, length, uploadDate}` and is
//! inserted before its chunks `{files_id, n, data}`, whose `data` is a BSON String cut on
//! UTF-8 character boundaries. The driver's GridFS bucket writes Binary chunks and rejects
//! String chunks when reading, so files are written and read here with plain collection
//! operations. Binary chunks written by other tools are read too (decoded lossily).

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::stream::BoxStream;
use futures::TryStreamExt;
use mongodb::Database;

/// Collection of GridFS file documents.
pub const FILES: &str = "tasks.files";
/// Collection of GridFS chunks.
pub const CHUNKS: &str = "tasks.chunks";
/// Largest chunk in bytes (GridFS's default chunk size, as Disbatch 4 uses).
pub const CHUNK_SIZE: usize = 261_120;
/// Chunks sent per `insert_many` (about 5 MiB).
const CHUNKS_PER_BATCH: usize = 20;

/// Errors of reading or writing a GridFS file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GridFsError {
    /// The database failed the operation.
    #[error("GridFS {op} of file {file_id}: {source}")]
    Database {
        /// What was being done ("write", "read").
        op: &'static str,
        /// The file.
        file_id: ObjectId,
        /// The driver's error.
        #[source]
        source: mongodb::error::Error,
    },
    /// There is no such file document.
    #[error("GridFS file {0} not found in {FILES}")]
    NotFound(ObjectId),
    /// The file's documents are inconsistent (missing or misnumbered chunks, wrong length, …).
    #[error("GridFS file {file_id} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        file_id: ObjectId,
        /// What is wrong.
        reason: String,
    },
}

/// Splits `text` into pieces of at most `max_bytes` bytes, each ending on a character
/// boundary. The pieces concatenate to `text`; none is empty (an empty `text` gives none).
///
/// # Panics
/// When `max_bytes` is below 4, the size of the widest UTF-8 character.
pub fn split_utf8(text: &str, max_bytes: usize) -> Vec<&str> {
    assert!(
        max_bytes >= 4,
        "split_utf8: max_bytes must be at least 4, got {max_bytes}"
    );
    let mut pieces = Vec::with_capacity(text.len().div_ceil(max_bytes));
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(max_bytes);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (piece, tail) = rest.split_at(end);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// Writes `text` as the GridFS file `file_id` named `filename` (`stdout` or `stderr`)
/// belonging to `task_id`: the file document, then its String chunks in batches.
/// Idempotent: the chunks of an earlier attempt at the same `file_id` (one cut short by a
/// lost connection, or whose reply was lost) are removed first and its file document
/// replaced, so a retried write leaves exactly one whole file.
pub async fn put_file(
    db: &Database,
    file_id: ObjectId,
    task_id: ObjectId,
    filename: &str,
    text: &str,
) -> Result<(), GridFsError> {
    let err = |source| GridFsError::Database {
        op: "write",
        file_id,
        source,
    };
    let length = i64::try_from(text.len()).map_err(|_| GridFsError::Corrupt {
        file_id,
        reason: format!("text of {} bytes is too long", text.len()),
    })?;
    let file = doc! {
        "_id": file_id,
        "filename": filename,
        "metadata": { "task_id": task_id },
        "chunkSize": CHUNK_SIZE as i32,
        "length": length,
        "uploadDate": DateTime::now(),
    };
    let chunks = db.collection::<Document>(CHUNKS);
    chunks.delete_many(doc! { "files_id": file_id }).await.map_err(err)?;
    db.collection::<Document>(FILES)
        .replace_one(doc! { "_id": file_id }, file)
        .upsert(true)
        .await
        .map_err(err)?;

    let pieces = split_utf8(text, CHUNK_SIZE);
    for (batch_no, batch) in pieces.chunks(CHUNKS_PER_BATCH).enumerate() {
        let first = batch_no * CHUNKS_PER_BATCH;
        let docs = batch.iter().enumerate().map(|(i, piece)| {
            doc! {
                "files_id": file_id,
                "n": chunk_number(first + i),
                "data": *piece,
            }
        });
        chunks.insert_many(docs).await.map_err(err)?;
    }
    Ok(())
}

/// Deletes the GridFS files `file_ids` of task `task_id`, chunks first, so that no chunk
/// is left without its file document; ids with no file are ignored. A file whose
/// `metadata.task_id` is another task's is left alone.
pub async fn delete_files(db: &Database, task_id: ObjectId, file_ids: &[ObjectId]) -> Result<(), GridFsError> {
    for &file_id in file_ids {
        let err = |source| GridFsError::Database {
            op: "delete",
            file_id,
            source,
        };
        let files = db.collection::<Document>(FILES);
        let other = files
            .count_documents(doc! { "_id": file_id, "metadata.task_id": { "$ne": task_id } })
            .limit(1)
            .await
            .map_err(err)?;
        if other > 0 {
            continue;
        }
        db.collection::<Document>(CHUNKS)
            .delete_many(doc! { "files_id": file_id })
            .await
            .map_err(err)?;
        files.delete_one(doc! { "_id": file_id }).await.map_err(err)?;
    }
    Ok(())
}

/// A chunk number as GridFS stores it (Int32, as other drivers write and expect).
fn chunk_number(n: usize) -> Bson {
    match i32::try_from(n) {
        Ok(n) => Bson::Int32(n),
        Err(_) => Bson::Int64(n as i64),
    }
}

/// Reads a whole GridFS file back as text: [`stream_file`]'s pieces concatenated.
pub async fn read_file(db: &Database, file_id: ObjectId) -> Result<String, GridFsError> {
    let mut pieces = stream_file(db, file_id).await?;
    let mut text = String::new();
    while let Some(piece) = pieces.try_next().await? {
        text.push_str(&piece);
    }
    Ok(text)
}

/// The pieces of a GridFS file's text, one chunk at a time, in order. Checks that chunks
/// are numbered `0, 1, 2, …` without gaps and that their bytes add up to the file's
/// `length`; a violation ends the stream with [`GridFsError::Corrupt`]. String chunks are
/// taken as they are; Binary chunks are decoded as UTF-8 (a character cut between two
/// chunks is joined again; invalid bytes become U+FFFD).
pub async fn stream_file(
    db: &Database,
    file_id: ObjectId,
) -> Result<BoxStream<'static, Result<String, GridFsError>>, GridFsError> {
    let err = move |source| GridFsError::Database {
        op: "read",
        file_id,
        source,
    };
    let corrupt = move |reason: String| GridFsError::Corrupt { file_id, reason };

    let file = db
        .collection::<Document>(FILES)
        .find_one(doc! { "_id": file_id })
        .await
        .map_err(err)?
        .ok_or(GridFsError::NotFound(file_id))?;
    let length = match file.get("length") {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(f)) if f.fract() == 0.0 && *f >= 0.0 && *f < 9.0e15 => *f as i64,
        other => return Err(corrupt(format!("field length is {other:?}, expected an integer"))),
    };
    let length = usize::try_from(length).map_err(|_| corrupt(format!("field length is negative ({length})")))?;
    let cursor = db
        .collection::<Document>(CHUNKS)
        .find(doc! { "files_id": file_id })
        .sort(doc! { "n": 1 })
        .await
        .map_err(err)?;

    struct State {
        cursor: mongodb::Cursor<Document>,
        /// The next chunk's `n`.
        expected: i64,
        /// Bytes read so far.
        read: usize,
        /// Bytes of Binary chunks not yet decoded (a character cut at a chunk's end).
        carry: Vec<u8>,
        done: bool,
    }
    let state = State {
        cursor,
        expected: 0,
        read: 0,
        carry: Vec::new(),
        done: false,
    };
    let pieces = futures::stream::try_unfold(state, move |mut st| async move {
        loop {
            if st.done {
                return Ok(None);
            }
            let Some(chunk) = st.cursor.try_next().await.map_err(err)? else {
                st.done = true;
                if st.read != length {
                    return Err(corrupt(format!(
                        "chunks hold {} bytes in {} chunks, but length = {length}",
                        st.read, st.expected
                    )));
                }
                if st.carry.is_empty() {
                    return Ok(None);
                }
                let rest = String::from_utf8_lossy(&std::mem::take(&mut st.carry)).into_owned();
                return Ok(Some((rest, st)));
            };
            let n = match chunk.get("n") {
                Some(Bson::Int32(n)) => i64::from(*n),
                Some(Bson::Int64(n)) => *n,
                Some(Bson::Double(f)) if f.fract() == 0.0 => *f as i64,
                other => {
                    return Err(corrupt(format!(
                        "chunk {} has n = {other:?}, expected an integer",
                        st.expected
                    )))
                }
            };
            if n != st.expected {
                return Err(corrupt(format!("expected chunk n = {}, found n = {n}", st.expected)));
            }
            st.expected += 1;
            let piece = match chunk.get("data") {
                Some(Bson::String(s)) if st.carry.is_empty() => {
                    st.read += s.len();
                    s.clone()
                }
                Some(Bson::String(s)) => {
                    st.read += s.len();
                    let mut text = String::from_utf8_lossy(&std::mem::take(&mut st.carry)).into_owned();
                    text.push_str(s);
                    text
                }
                Some(Bson::Binary(b)) => {
                    st.read += b.bytes.len();
                    st.carry.extend_from_slice(&b.bytes);
                    decode_complete(&mut st.carry)
                }
                other => {
                    let kind = other.map_or("missing".to_string(), |b| format!("{:?}", b.element_type()));
                    return Err(corrupt(format!(
                        "chunk {n} has data of type {kind}, expected String or Binary"
                    )));
                }
            };
            if st.read > length {
                return Err(corrupt(format!("chunks hold more than length = {length} bytes")));
            }
            if !piece.is_empty() {
                return Ok(Some((piece, st)));
            }
        }
    });
    Ok(Box::pin(pieces))
}

/// Decodes the complete characters at the front of `bytes` (invalid bytes as U+FFFD) and
/// leaves in it only a character cut at its end.
fn decode_complete(bytes: &mut Vec<u8>) -> String {
    let mut text = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(s) => {
                text.push_str(s);
                start = bytes.len();
                break;
            }
            Err(e) => {
                let valid = start + e.valid_up_to();
                text.push_str(std::str::from_utf8(&bytes[start..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(bad) => {
                        text.push(char::REPLACEMENT_CHARACTER);
                        start = valid + bad;
                    }
                    None => {
                        start = valid;
                        break;
                    }
                }
            }
        }
    }
    bytes.drain(..start);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, max: usize) -> Vec<&str> {
        let pieces = split_utf8(text, max);
        assert_eq!(pieces.concat(), text);
        for p in &pieces {
            assert!(!p.is_empty());
            assert!(p.len() <= max, "piece of {} bytes > {max}", p.len());
        }
        pieces
    }

    #[test]
    fn binary_chunks_decode_characters_cut_between_them() {
        let mut carry = vec![b'a', 0xC3];
        assert_eq!(decode_complete(&mut carry), "a");
        assert_eq!(carry, [0xC3]);
        carry.extend_from_slice(&[0xA9, b'b']);
        assert_eq!(decode_complete(&mut carry), "éb");
        assert!(carry.is_empty());
        let mut bad = vec![0xFF, b'x', 0xE2, 0x82];
        assert_eq!(decode_complete(&mut bad), "\u{FFFD}x");
        assert_eq!(bad, [0xE2, 0x82], "a cut character waits for the next chunk");
    }

    #[test]
    fn empty_text_gives_no_pieces() {
        assert!(split_utf8("", 4).is_empty());
        assert!(split_utf8("", CHUNK_SIZE).is_empty());
    }

    #[test]
    fn ascii_splits_evenly() {
        let text = "a".repeat(10);
        assert_eq!(check(&text, 4), vec!["aaaa", "aaaa", "aa"]);
        assert_eq!(check(&text, 10), vec![text.as_str()]);
        assert_eq!(check(&text, 11), vec![text.as_str()]);
    }

    #[test]
    fn multibyte_characters_are_never_cut() {
        let text = "aé€😀".repeat(100);
        for max in 4..=23 {
            let pieces = check(&text, max);
            // Greedy: every piece but the last could not take the next character.
            for w in pieces.windows(2) {
                let next = w[1].chars().next().map_or(0, char::len_utf8);
                assert!(w[0].len() + next > max);
            }
        }
        assert_eq!(check("😀😀", 4), vec!["😀", "😀"]);
        assert_eq!(check("😀😀", 7), vec!["😀", "😀"]);
        assert_eq!(check("é😀", 5), vec!["é", "😀"]);
    }

    #[test]
    fn chunk_size_pieces_of_large_text() {
        let text = "x€".repeat(200_000);
        let pieces = check(&text, CHUNK_SIZE);
        assert_eq!(pieces.len(), text.len().div_ceil(CHUNK_SIZE));
    }

    #[test]
    #[should_panic(expected = "at least 4")]
    fn too_small_max_panics() {
        split_utf8("abc", 3);
    }

    #[test]
    fn chunk_numbers_are_int32() {
        assert_eq!(chunk_number(0), Bson::Int32(0));
        assert_eq!(chunk_number(77), Bson::Int32(77));
    }
}
