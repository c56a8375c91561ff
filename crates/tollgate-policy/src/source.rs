//! Where limits come from: a format, and the files of a path read as texts, so that a caller can
//! keep what it read (to notice when it changes) and parse it again the same way.

use std::path::Path;

use crate::error::{PolicyError, Position};
use crate::policy::Policy;

/// The format of a limits path.
///
/// ```
/// use tollgate_policy::Format;
/// assert_eq!(Format::from_name("envoy"), Some(Format::Envoy));
/// assert_eq!(Format::default().name(), "limitador");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Format {
    /// Limitador's limits file, with Tollgate's optional fields: one YAML list of limits.
    #[default]
    Limitador,
    /// envoy/ratelimit's configuration: a directory of YAML files (or one file), each a `domain`
    /// and its tree of `descriptors`; see [`Policy::parse_envoy`].
    Envoy,
    /// envoy/ratelimit's configuration with `MERGE_DOMAIN_CONFIG` set: files with the same
    /// `domain` add their descriptors to it (`tollgate serve --format envoy --merge-domains`);
    /// see [`Policy::parse_envoy_merging_domains`]. Named `envoy`, as [`Format::Envoy`].
    EnvoyMergingDomains,
}

impl Format {
    /// Every format `--format` names, in the order messages list them
    /// ([`Format::EnvoyMergingDomains`] is `envoy` with `--merge-domains`).
    pub const ALL: [Format; 2] = [Format::Limitador, Format::Envoy];

    /// `limitador` or `envoy`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Limitador => "limitador",
            Format::Envoy | Format::EnvoyMergingDomains => "envoy",
        }
    }

    /// Parses [`Format::name`].
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Reads the texts of `path`: the file, for Limitador's format; for envoy's, the YAML files
    /// (`*.yaml`, `*.yml`, not hidden) directly in the directory, in name order, or the one file
    /// `path` names.
    pub fn read(self, path: &Path) -> Result<Vec<SourceText>, PolicyError> {
        match self {
            Format::Limitador => Ok(vec![SourceText::read(path)?]),
            Format::Envoy | Format::EnvoyMergingDomains => read_yaml_dir(path),
        }
    }

    /// Parses texts read by [`Format::read`] into one policy.
    pub fn parse(self, sources: &[SourceText]) -> Result<Policy, PolicyError> {
        match self {
            Format::Limitador => Policy::parse_all(sources),
            Format::Envoy => Policy::parse_envoy(sources),
            Format::EnvoyMergingDomains => Policy::parse_envoy_merging_domains(sources),
        }
    }

    /// Reads and parses `path`.
    pub fn load(self, path: &Path) -> Result<Policy, PolicyError> {
        self.parse(&self.read(path)?)
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One file's text and the name errors give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceText {
    /// The file (or other source name), as errors and [`crate::Limit::source_name`] give it.
    pub name: String,
    /// Its content.
    pub text: String,
}

impl SourceText {
    /// A text named `name`.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> SourceText {
        SourceText { name: name.into(), text: text.into() }
    }

    /// Reads the file at `path`, named by its path.
    pub fn read(path: &Path) -> Result<SourceText, PolicyError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::new(&name, Position::default(), format!("cannot read the limits file: {e}")))?;
        Ok(SourceText { name, text })
    }
}

/// The YAML files of a directory, in name order, or the one file `path` is.
fn read_yaml_dir(path: &Path) -> Result<Vec<SourceText>, PolicyError> {
    let name = path.display().to_string();
    let cannot = |e: std::io::Error| PolicyError::new(&name, Position::default(), format!("cannot read: {e}"));
    if !std::fs::metadata(path).map_err(cannot)?.is_dir() {
        return Ok(vec![SourceText::read(path)?]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(cannot)? {
        let entry = entry.map_err(cannot)?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let yaml = file_name.ends_with(".yaml") || file_name.ends_with(".yml");
        // Hidden names are Kubernetes' `..data` and editors' swap files; `metadata` follows
        // symbolic links, as a ConfigMap's files are.
        if yaml && !file_name.starts_with('.') && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
            files.push(entry.path());
        }
    }
    if files.is_empty() {
        return Err(PolicyError::new(&name, Position::default(), "no YAML files (*.yaml, *.yml) in this directory"));
    }
    files.sort();
    files.iter().map(|file| SourceText::read(file)).collect()
}
