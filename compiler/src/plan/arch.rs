//! [`Arch`]: the GPU architecture a memory plan is for, `sm_XX` (e.g. `sm_89`, `sm_90`),
//! parsed once ([`FromStr`](std::str::FromStr)) and serialized as that same text.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A CUDA compute capability as NVRTC names it: `sm_` and at least two digits (major,
/// then minor: `sm_89` is 8.9, `sm_100` is 10.0).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Arch {
    /// The digits after `sm_`.
    digits: String,
}

impl Arch {
    /// `sm_89`, the default (an RTX 4090).
    pub fn sm_89() -> Arch {
        Arch { digits: "89".into() }
    }
}

impl Default for Arch {
    fn default() -> Arch {
        Arch::sm_89()
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.digits)
    }
}

/// Why a text is not an [`Arch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchError(String);

impl fmt::Display for ArchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: expected sm_XX, e.g. sm_89 or sm_90", self.0)
    }
}

impl std::error::Error for ArchError {}

impl FromStr for Arch {
    type Err = ArchError;

    fn from_str(s: &str) -> Result<Arch, ArchError> {
        match s.strip_prefix("sm_") {
            Some(d) if d.len() >= 2 && d.chars().all(|c| c.is_ascii_digit()) => Ok(Arch { digits: d.to_string() }),
            _ => Err(ArchError(s.chars().take(64).collect())),
        }
    }
}

impl TryFrom<String> for Arch {
    type Error = ArchError;

    fn try_from(s: String) -> Result<Arch, ArchError> {
        s.parse()
    }
}

impl From<Arch> for String {
    fn from(a: Arch) -> String {
        a.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::Arch;

    #[test]
    fn parses_and_prints_sm_names() {
        for s in ["sm_89", "sm_90", "sm_100"] {
            assert_eq!(s.parse::<Arch>().map(|a| a.to_string()).as_deref(), Ok(s));
        }
        for bad in ["", "sm_", "sm_8", "sm_8x", "compute_89", "89", "sm_89a"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
        assert_eq!(Arch::default().to_string(), "sm_89");
        assert_eq!(
            serde_json::to_string(&Arch::default()).ok().as_deref(),
            Some("\"sm_89\"")
        );
        assert_eq!(serde_json::from_str::<Arch>("\"sm_90\"").ok(), "sm_90".parse().ok());
        assert!(serde_json::from_str::<Arch>("\"x\"").is_err());
    }
}
