//! Reading a worker's log for `zergctl logs`: the last lines from the end of the file in
//! bounded chunks, then what is appended, whatever the bytes are (lossy UTF-8) and however long
//! the lines. Memory stays at a few chunks and the lines sent, whatever size the log has.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

/// Bytes read at a time.
const CHUNK: usize = 64 << 10;
/// The longest line sent; the rest of a longer one is cut, with a mark.
pub const MAX_LINE: usize = 16 << 10;
/// How far back from the end the tail looks for line starts.
const MAX_SCAN: u64 = 8 << 20;

/// The last `n` lines of `f` (fewer when the file has fewer, or when they start more than
/// [`MAX_SCAN`] bytes before the end), and the offset of the end of the last complete line,
/// from where [`Follower`] goes on. A last line without its newline is left for the follower.
pub fn tail(f: &mut File, n: usize) -> io::Result<(Vec<String>, u64)> {
    let len = f.metadata()?.len();
    // Find where the last complete line ends, then walk back over `n` newlines.
    let mut pos = len;
    let mut newlines = 0usize;
    let mut end = None;
    let mut start = None;
    let mut buf = vec![0u8; CHUNK];
    while pos > 0 && len - pos < MAX_SCAN && start.is_none() {
        let step = (pos as usize).min(CHUNK);
        pos -= step as u64;
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut buf[..step])?;
        for (i, b) in buf[..step].iter().enumerate().rev() {
            if *b != b'\n' {
                continue;
            }
            let at = pos + i as u64 + 1;
            if end.is_none() {
                end = Some(at);
                continue;
            }
            newlines += 1;
            if newlines == n {
                start = Some(at);
                break;
            }
        }
    }
    let Some(end) = end else {
        // No complete line at all (or none within reach).
        return Ok((Vec::new(), if len > MAX_SCAN { len } else { 0 }));
    };
    let start = start.unwrap_or(if len - pos >= MAX_SCAN { pos } else { 0 });
    let mut fol = Follower::at(start);
    let mut lines = fol.read_to(f, end)?;
    if lines.len() > n {
        lines.drain(..lines.len() - n);
    }
    Ok((lines, end))
}

/// Follows a growing log from an offset, a complete line at a time.
#[derive(Debug)]
pub struct Follower {
    offset: u64,
    partial: Vec<u8>,
    cut: bool,
}

impl Follower {
    /// Starts at `offset`.
    pub fn at(offset: u64) -> Self {
        Self {
            offset,
            partial: Vec::new(),
            cut: false,
        }
    }

    /// The complete lines appended since the last call, at most about a megabyte of the file
    /// per call. A file that shrank (rotated, truncated) is read again from its start.
    pub fn read_new(&mut self, f: &mut File) -> io::Result<Vec<String>> {
        let len = f.metadata()?.len();
        if len < self.offset {
            *self = Self::at(0);
        }
        let upto = len.min(self.offset + 16 * CHUNK as u64);
        self.read_to(f, upto)
    }

    fn read_to(&mut self, f: &mut File, upto: u64) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        if upto <= self.offset {
            return Ok(out);
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut left = upto - self.offset;
        let mut buf = vec![0u8; CHUNK];
        while left > 0 {
            let want = (left as usize).min(CHUNK);
            let got = f.read(&mut buf[..want])?;
            if got == 0 {
                break;
            }
            left -= got as u64;
            self.offset += got as u64;
            for part in buf[..got].split_inclusive(|b| *b == b'\n') {
                let (body, ends) = match part.strip_suffix(b"\n") {
                    Some(b) => (b, true),
                    None => (part, false),
                };
                let room = MAX_LINE.saturating_sub(self.partial.len());
                if body.len() > room {
                    self.cut = true;
                }
                self.partial
                    .extend_from_slice(&body[..body.len().min(room)]);
                if ends {
                    let mut line = String::from_utf8_lossy(&self.partial).into_owned();
                    if self.cut {
                        line.push_str(" […]");
                    }
                    out.push(line);
                    self.partial.clear();
                    self.cut = false;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut t = tempfile::NamedTempFile::new().unwrap();
        t.write_all(bytes).unwrap();
        let f = File::open(t.path()).unwrap();
        (t, f)
    }

    #[test]
    fn the_tail_of_a_big_log_of_bare_newlines_reads_one_chunk() {
        let (_t, mut f) = file(&vec![b'\n'; 7 << 20]);
        let (lines, end) = tail(&mut f, 100).unwrap();
        assert_eq!(lines.len(), 100);
        assert!(lines.iter().all(String::is_empty));
        assert_eq!(end, 7 << 20);
    }

    #[test]
    fn any_bytes_and_long_lines_come_through_and_following_goes_on() {
        let mut data = b"first\n".to_vec();
        data.extend_from_slice(b"bad \xff\xfe byte\n");
        data.extend(vec![b'x'; 100_000]);
        data.extend_from_slice(b"\nlast\npartial");
        let (mut t, mut f) = file(&data);
        let (lines, end) = tail(&mut f, 3).unwrap();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0], "bad \u{fffd}\u{fffd} byte");
        assert_eq!(lines[1].len(), MAX_LINE + " […]".len());
        assert_eq!(lines[2], "last");
        // The unfinished line arrives once it ends, and more after it.
        let mut fol = Follower::at(end);
        assert!(fol.read_new(&mut f).unwrap().is_empty());
        t.write_all(b" done\n\xc3\n").unwrap();
        assert_eq!(
            fol.read_new(&mut f).unwrap(),
            vec!["partial done".to_string(), "\u{fffd}".to_string()]
        );
        // Fewer lines than asked, and an empty file.
        let (_t2, mut g) = file(b"a\nb\n");
        assert_eq!(tail(&mut g, 100).unwrap().0, vec!["a", "b"]);
        let (_t3, mut h) = file(b"");
        assert_eq!(tail(&mut h, 10).unwrap(), (vec![], 0));
    }
}
