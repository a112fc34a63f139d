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
