//! A worker's token: 32 random bytes, hex-encoded, handed to one spawn generation of one worker
//! slot and kept by zergd only as its SHA-256.

use sha2::{Digest, Sha256};

/// A worker's secret: 32 random bytes, hex-encoded. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerToken(String);

impl std::fmt::Debug for WorkerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerToken(<redacted>)")
    }
}

impl WorkerToken {
    /// A fresh token from the operating system's random source.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        // Without the OS random source no token can be trusted: zergd stops (and its service
        // manager restarts it) rather than hand out guessable ones.
        getrandom::fill(&mut bytes).expect("the operating system's random source failed");
        Self(hex(&bytes))
    }

    /// The token as sent by the worker.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its SHA-256, hex-encoded: what the state file keeps.
    pub fn hash(&self) -> String {
        hash_token(&self.0)
    }
}

/// SHA-256 of a token, hex-encoded.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex_and_never_printed() {
        let a = WorkerToken::generate();
        let b = WorkerToken::generate();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().chars().all(|c| c.is_ascii_hexdigit()));
        assert!(!format!("{a:?}").contains(a.expose()));
        assert_eq!(a.hash(), hash_token(a.expose()));
        assert_ne!(a.hash(), a.expose());
    }
}
