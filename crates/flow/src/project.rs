//! Projects: reading a project (a directory, or a tar or zip of one) and validating its input
//! flows before anything is deployed (docs/contract.md §3, "Project layout").
//!
//! ```text
//! plugins/entities/<Entity>/input/<Flow>/<Flow>.properties
//! plugins/entities/<Entity>/input/<Flow>/main.sjs|main.xqy, content.*, headers.*, triples.*
//! ```
//!
//! Validation collects every fault, each naming its file, so one deploy attempt shows all.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Largest project accepted (all files together).
const MAX_PROJECT_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodeFormat {
    Sjs,
    Xqy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    Json,
    Xml,
}

impl DataFormat {
    pub fn name(self) -> &'static str {
        match self {
            DataFormat::Json => "json",
            DataFormat::Xml => "xml",
        }
    }
}

/// One deployed input flow: its settings and its modules' sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowDef {
    /// The entity name as written in the project.
    pub entity: String,
    pub flow: String,
    pub code_format: CodeFormat,
    pub data_format: DataFormat,
    /// Path of the main module, relative to the flow's folder.
    pub main_module: String,
    /// Every file of the flow's folder (relative path -> text), for `require`.
    pub modules: BTreeMap<String, String>,
}

impl FlowDef {
    /// The registry key: entity names match case-insensitively, flow names exactly.
    pub fn key(&self) -> String {
        flow_key(&self.entity, &self.flow)
    }
}

pub(crate) fn flow_key(entity: &str, flow: &str) -> String {
    format!("{}:{}", entity.to_lowercase(), flow)
}

/// A project's files: path relative to the project root (with `/`) -> bytes.
pub(crate) type Files = BTreeMap<String, Vec<u8>>;

/// What a deploy would install, and what it warns about.
#[derive(Debug, Clone, Default)]
pub struct Project {
    pub flows: Vec<FlowDef>,
    pub warnings: Vec<String>,
}

fn add_file(
    files: &mut Files,
    total: &mut u64,
    path: String,
    bytes: Vec<u8>,
) -> Result<(), Vec<String>> {
    *total += bytes.len() as u64;
    if *total > MAX_PROJECT_BYTES {
        return Err(vec![format!(
            "the project is larger than {MAX_PROJECT_BYTES} bytes"
        )]);
    }
    files.insert(path, bytes);
    Ok(())
}

/// Read a project directory.
pub fn read_dir(root: &Path) -> Result<Files, Vec<String>> {
    let mut files = Files::new();
    let mut total = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| vec![format!("{}: {e}", dir.display())])?;
        for entry in entries {
            let entry = entry.map_err(|e| vec![format!("{}: {e}", dir.display())])?;
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            let bytes = std::fs::read(&path).map_err(|e| vec![format!("{rel}: {e}")])?;
            add_file(&mut files, &mut total, rel, bytes)?;
        }
    }
    Ok(files)
}

/// Read a tar or zip archive of a project (by its magic bytes). A single top-level folder
/// wrapping `plugins/` is stripped.
pub fn read_archive(bytes: &[u8]) -> Result<Files, Vec<String>> {
    let mut files = Files::new();
    let mut total = 0;
    if bytes.starts_with(b"PK") {
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))
            .map_err(|e| vec![format!("the zip archive cannot be read: {e}")])?;
        for i in 0..zip.len() {
            let mut f = zip
                .by_index(i)
                .map_err(|e| vec![format!("zip entry {i}: {e}")])?;
            if f.is_dir() {
                continue;
            }
            let Some(name) = f.enclosed_name() else {
                return Err(vec![format!("zip entry {:?} has an unsafe path", f.name())]);
            };
            let rel = name.to_string_lossy().replace('\\', "/");
            let mut buf = Vec::new();
            f.by_ref()
                .take(MAX_PROJECT_BYTES + 1)
                .read_to_end(&mut buf)
                .map_err(|e| vec![format!("{rel}: {e}")])?;
            add_file(&mut files, &mut total, rel, buf)?;
        }
    } else {
        let mut archive = tar::Archive::new(std::io::Cursor::new(bytes));
        let entries = archive
            .entries()
            .map_err(|e| vec![format!("the body is neither a zip nor a tar archive: {e}")])?;
        for entry in entries {
            let mut entry =
                entry.map_err(|e| vec![format!("the tar archive cannot be read: {e}")])?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let path = entry
                .path()
                .map_err(|e| vec![format!("tar entry path: {e}")])?
                .into_owned();
            if path.components().any(|c| {
                !matches!(
                    c,
                    std::path::Component::Normal(_) | std::path::Component::CurDir
                )
            }) {
                return Err(vec![format!(
                    "tar entry {} has an unsafe path",
                    path.display()
                )]);
            }
            let rel = path
                .to_string_lossy()
                .trim_start_matches("./")
                .replace('\\', "/");
            let mut buf = Vec::new();
            entry
                .by_ref()
                .take(MAX_PROJECT_BYTES + 1)
                .read_to_end(&mut buf)
                .map_err(|e| vec![format!("{rel}: {e}")])?;
            add_file(&mut files, &mut total, rel, buf)?;
        }
        if files.is_empty() {
            return Err(vec![
                "the body is neither a zip nor a tar archive with files".into(),
            ]);
        }
    }
    // `myproject/plugins/...` -> `plugins/...`
    if !files.keys().any(|k| k.starts_with("plugins/")) {
        let prefixes: std::collections::BTreeSet<&str> = files
            .keys()
            .filter_map(|k| k.split_once('/').map(|p| p.0))
            .collect();
        if prefixes.len() == 1 {
            let prefix = format!("{}/", prefixes.iter().next().copied().unwrap_or_default());
            files = files
                .into_iter()
                .map(|(k, v)| (k.strip_prefix(&prefix).unwrap_or(&k).to_string(), v))
                .collect();
        }
    }
    Ok(files)
}

fn parse_properties(path: &str, text: &str, errors: &mut Vec<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let Some((k, v)) = line.split_once(['=', ':']) else {
            errors.push(format!("{path}:{}: not a key=value line: {line:?}", i + 1));
            continue;
        };
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    out
}

/// Validate every input flow of a project. Errors name the file; nothing is partial.
pub(crate) fn validate(files: &Files) -> Result<Project, Vec<String>> {
    let mut errors = Vec::new();
    let mut project = Project::default();
    for (path, bytes) in files {
        let parts: Vec<&str> = path.split('/').collect();
        // plugins/entities/<Entity>/input/<Flow>/<Flow>.properties
        let ["plugins", "entities", entity, "input", flow, file] = parts.as_slice() else {
            continue;
        };
        if *file != format!("{flow}.properties") {
            continue;
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            errors.push(format!("{path}: not UTF-8 text"));
            continue;
        };
        let props = parse_properties(path, text, &mut errors);
        let code_format = match props.get("codeFormat").map(String::as_str) {
            Some("sjs") => Some(CodeFormat::Sjs),
            Some("xqy") => Some(CodeFormat::Xqy),
            Some(other) => {
                errors.push(format!("{path}: unknown codeFormat {other:?} (sjs or xqy)"));
                None
            }
            None => {
                errors.push(format!("{path}: codeFormat is missing (sjs or xqy)"));
                None
            }
        };
        let data_format = match props.get("dataFormat").map(String::as_str) {
            Some("json") => Some(DataFormat::Json),
            Some("xml") => Some(DataFormat::Xml),
            Some(other) => {
                errors.push(format!(
                    "{path}: unknown dataFormat {other:?} (json or xml)"
                ));
                None
            }
            None => {
                errors.push(format!("{path}: dataFormat is missing (json or xml)"));
                None
            }
        };
        if let Some(m) = props.get("mainCodeFormat")
            && !matches!(m.as_str(), "sjs" | "xqy")
        {
            errors.push(format!("{path}: unknown mainCodeFormat {m:?} (sjs or xqy)"));
        }
        let (Some(code_format), Some(data_format)) = (code_format, data_format) else {
            continue;
        };
        let dir = format!("plugins/entities/{entity}/input/{flow}/");
        let ext = match code_format {
            CodeFormat::Sjs => "sjs",
            CodeFormat::Xqy => "xqy",
        };
        let main_module = props
            .get("mainModule")
            .cloned()
            .unwrap_or_else(|| format!("main.{ext}"));
        let mut modules = BTreeMap::new();
        for (p, b) in files.range(dir.clone()..) {
            let Some(rel) = p.strip_prefix(&dir) else {
                break;
            };
            if rel.ends_with(".properties") {
                continue;
            }
            match String::from_utf8(b.clone()) {
                Ok(t) => {
                    modules.insert(rel.to_string(), t);
                }
                Err(_) => errors.push(format!("{p}: a plugin module must be UTF-8 text")),
            }
        }
        if !modules.contains_key(&main_module) {
            errors.push(format!(
                "{dir}{main_module}: the main module is missing ({path} names it)"
            ));
            continue;
        }
        let xqy: Vec<&String> = modules.keys().filter(|m| m.ends_with(".xqy")).collect();
        if !xqy.is_empty() {
            project.warnings.push(format!(
                "{entity}:{flow}: XQuery modules are not executed; the flow runs the default plugins (identity content, empty headers and triples) instead of: {}",
                xqy.iter().map(|m| format!("{dir}{m}")).collect::<Vec<_>>().join(", ")
            ));
        }
        if project
            .flows
            .iter()
            .any(|f: &FlowDef| f.key() == flow_key(entity, flow))
        {
            errors.push(format!(
                "{path}: flow {entity}:{flow} is defined twice (entity names ignore case)"
            ));
            continue;
        }
        project.flows.push(FlowDef {
            entity: entity.to_string(),
            flow: flow.to_string(),
            code_format,
            data_format,
            main_module,
            modules,
        });
    }
    if project.flows.is_empty() && errors.is_empty() {
        errors.push(
            "no input flows found (plugins/entities/<Entity>/input/<Flow>/<Flow>.properties)"
                .into(),
        );
    }
    if errors.is_empty() {
        Ok(project)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Files {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    const PROPS: &str =
        "mainModule=main.sjs\nmainCodeFormat=sjs\ncodeFormat=sjs\ndataFormat=json\n";

    #[test]
    fn a_valid_project() {
        let p = validate(&files(&[
            ("plugins/entities/Mollusk/input/Load/Load.properties", PROPS),
            (
                "plugins/entities/Mollusk/input/Load/main.sjs",
                "module.exports = {};",
            ),
            (
                "plugins/entities/Mollusk/input/Load/content.sjs",
                "module.exports = {};",
            ),
            (
                "plugins/entities/Mollusk/input/Xq/Xq.properties",
                "codeFormat=xqy\ndataFormat=xml\n",
            ),
            (
                "plugins/entities/Mollusk/input/Xq/main.xqy",
                "xquery version '1.0-ml';",
            ),
            ("README.md", "hello"),
        ]))
        .unwrap();
        assert_eq!(p.flows.len(), 2);
        let load = p.flows.iter().find(|f| f.flow == "Load").unwrap();
        assert_eq!(load.key(), "mollusk:Load");
        assert_eq!(load.modules.len(), 2);
        assert_eq!(p.warnings.len(), 1);
        assert!(p.warnings[0].contains("plugins/entities/Mollusk/input/Xq/main.xqy"));
    }

    #[test]
    fn every_fault_names_its_file() {
        let errors = validate(&files(&[
            (
                "plugins/entities/A/input/F1/F1.properties",
                "codeFormat=js\ndataFormat=json\n",
            ),
            (
                "plugins/entities/A/input/F2/F2.properties",
                "codeFormat=sjs\ndataFormat=yaml\n",
            ),
            (
                "plugins/entities/A/input/F3/F3.properties",
                "codeFormat=sjs\ndataFormat=json\n",
            ),
            (
                "plugins/entities/A/input/F4/F4.properties",
                "this line is broken\ncodeFormat=sjs\ndataFormat=json\n",
            ),
            ("plugins/entities/A/input/F4/main.sjs", ""),
        ]))
        .unwrap_err();
        let all = errors.join("\n");
        assert!(
            all.contains("F1/F1.properties: unknown codeFormat \"js\""),
            "{all}"
        );
        assert!(
            all.contains("F2/F2.properties: unknown dataFormat \"yaml\""),
            "{all}"
        );
        assert!(
            all.contains("F3/main.sjs: the main module is missing"),
            "{all}"
        );
        assert!(
            all.contains("F4/F4.properties:1: not a key=value line"),
            "{all}"
        );
        assert_eq!(errors.len(), 4);
    }

    #[test]
    fn archives_tar_and_zip() {
        let mut tar_bytes = Vec::new();
        {
            let mut b = tar::Builder::new(&mut tar_bytes);
            for (path, text) in [
                ("proj/plugins/entities/E/input/F/F.properties", PROPS),
                (
                    "proj/plugins/entities/E/input/F/main.sjs",
                    "module.exports={};",
                ),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(text.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, path, text.as_bytes()).unwrap();
            }
            b.finish().unwrap();
        }
        let files = read_archive(&tar_bytes).unwrap();
        assert!(
            files.contains_key("plugins/entities/E/input/F/main.sjs"),
            "{:?}",
            files.keys()
        );
        assert_eq!(validate(&files).unwrap().flows.len(), 1);
        assert!(read_archive(b"neither").is_err());
    }
}
