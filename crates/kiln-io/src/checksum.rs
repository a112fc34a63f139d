//! The checksum of every file kiln reads back (cache shards, trial files).

/// XXH3-128 of `bytes` as 32 hex digits: fast enough to check every read (tens of GB/s), and a
/// flipped bit anywhere changes it.
///
/// ```
/// assert_eq!(kiln_io::checksum(b"kiln").len(), 32);
/// assert_ne!(kiln_io::checksum(b"kiln"), kiln_io::checksum(b"kilm"));
/// ```
pub fn checksum(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

/// What identifies an input a run was made from, to tell at resume whether it changed: a file's
/// checksum; for a directory, the checksum of the listing of every file in it (relative path,
/// size, modification time — the contents of a large dataset are not read again).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let file = dir.path().join("captions.jsonl");
/// std::fs::write(&file, "{}").unwrap();
/// let before = kiln_io::fingerprint(dir.path()).unwrap();
/// std::fs::write(dir.path().join("extra.gif"), "GIF").unwrap();
/// assert_ne!(kiln_io::fingerprint(dir.path()).unwrap(), before);
/// assert_eq!(kiln_io::fingerprint(&file).unwrap(), kiln_io::checksum(b"{}"));
/// ```
pub fn fingerprint(path: &std::path::Path) -> Result<String, crate::FileError> {
    fn io(p: &std::path::Path) -> impl FnOnce(std::io::Error) -> crate::FileError + '_ {
        move |e| crate::FileError::io(p, e)
    }
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if !meta.is_dir() {
        return Ok(checksum(&std::fs::read(path).map_err(io(path))?));
    }
    let mut listing = Vec::new();
    let mut pending = vec![path.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let entry = entry.map_err(io(&dir))?;
            let meta = entry.metadata().map_err(io(&entry.path()))?;
            if meta.is_dir() {
                pending.push(entry.path());
                continue;
            }
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |t| t.as_nanos());
            let name = entry.path();
            let name = name
                .strip_prefix(path)
                .unwrap_or(&name)
                .to_string_lossy()
                .into_owned();
            listing.push(format!("{name}\t{}\t{modified}\n", meta.len()));
        }
    }
    listing.sort();
    Ok(checksum(listing.concat().as_bytes()))
}
