//! What the views could not make of the documents: the problems kept for
//! `/v1/diagnostics`, bounded in number.

use super::*;

/// A problem a view has with a stored document: rows skipped, or a geometry left out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    pub uri: String,
    pub view: String,
    pub problem: String,
    /// Whether the document has no rows in the view (else only its geometry is missing).
    #[serde(rename = "rowsSkipped")]
    pub rows_skipped: bool,
}

/// Most problems kept; past it they are counted only.
pub(crate) const MAX_DIAGNOSTICS: usize = 10_000;

/// The views' current problems with stored documents, by document and view: what a build
/// skipped or a write was warned of, until the document is written again or its view rebuilt.
#[derive(Default)]
pub(crate) struct Diagnostics {
    pub(crate) by_doc: BTreeMap<(String, String), (String, bool)>,
    /// Problems not kept, past [`MAX_DIAGNOSTICS`].
    pub(crate) omitted: u64,
}

impl Diagnostics {
    /// Record a problem; logged at `debug` only (a build logs one summary, a write answers
    /// its warnings), so that many bad documents do not flood the log.
    pub(crate) fn add(&mut self, uri: &str, view: &ViewKey, problem: String, rows_skipped: bool) {
        tracing::debug!(uri, view = %view, problem, rows_skipped, "a view cannot use a document in full");
        if self.by_doc.len() >= MAX_DIAGNOSTICS {
            self.omitted += 1;
            return;
        }
        self.by_doc
            .insert((uri.to_string(), view.to_string()), (problem, rows_skipped));
    }

    pub(crate) fn clear_document(&mut self, uri: &str) {
        if self.by_doc.is_empty() {
            return;
        }
        let keys: Vec<(String, String)> = self
            .by_doc
            .range((uri.to_string(), String::new())..)
            .take_while(|((u, _), _)| u == uri)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.by_doc.remove(&k);
        }
    }

    pub(crate) fn clear_view(&mut self, view: &ViewKey) {
        let name = view.to_string();
        self.by_doc.retain(|(_, v), _| *v != name);
    }
}
