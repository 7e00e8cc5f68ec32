//! Input flows (INTERFACE §2.1, §4.1; docs/contract.md §3): deployed projects, running a named flow
//! on a document as it is written, the envelope it stores, and trace records.
//!
//! - [`project`]: reading and validating a project (directory, tar or zip).
//! - [`envelope`]: the JSON and XML envelopes.
//! - [`js`]: the pooled QuickJS host for `codeFormat=sjs` plugins.
//!
//! `codeFormat=xqy` flows run the default plugins (identity content, `{}` headers, `[]`
//! triples): XQuery is not executed, and deploy says so for every XQuery module it meets.
//! This module knows nothing of HTTP; it hands back the envelope to store, or an error.

// Sibling crates under the module names the code uses.
use geoshard_core::{acl, error, metrics, time};
use geoshard_store as store;

pub mod envelope;
pub mod js;
pub mod project;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde_json::{Value, json};
use thiserror::Error;

use crate::acl::Caller;
use crate::error::{ApiError, ErrorCode, PluginStatus};
use crate::store::{Format, Op, Store, StoreError, Table};
use envelope::Content;
use js::{JsPool, JsSettings, Raw, RunResult, Step};
use project::{CodeFormat, DataFormat, FlowDef, Project, flow_key};

/// The `transform=` names that run an input flow (the interface's spelling and the real
/// world's).
pub const FLOW_TRANSFORMS: [&str; 6] = [
    "svc:inputFlow",
    "svc:sjsInputFlow",
    "ml:inputFlow",
    "ml:sjsInputFlow",
    "run-flow",
    "run-sjs-flow",
];

pub fn is_flow_transform(name: &str) -> bool {
    FLOW_TRANSFORMS.contains(&name)
}

const GENERATION_KEY: &str = "generation";
const FLOW_PREFIX: &str = "flow:";

#[derive(Debug, Error)]
pub enum FlowError {
    #[error("The specified flow {entity}:{flow} is missing.")]
    Missing { entity: String, flow: String },
    #[error("{message}")]
    Plugin {
        status: PluginStatus,
        message: String,
    },
    #[error("{0}")]
    BadContent(String),
    #[error("deploy failed: {}", .0.join("; "))]
    Deploy(Vec<String>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<FlowError> for ApiError {
    fn from(e: FlowError) -> ApiError {
        let code = match &e {
            FlowError::Missing { .. } => ErrorCode::ExtensionNotFound,
            FlowError::Plugin { status, .. } => ErrorCode::PluginFailed(*status),
            FlowError::BadContent(_) => ErrorCode::ExtensionInvalid,
            FlowError::Deploy(_) => ErrorCode::InvalidRequest,
            FlowError::Store(inner) => return ApiError::from(inner.clone()),
        };
        ApiError::new(code, e.to_string())
    }
}

/// Settings of the flow service, from `Config`.
#[derive(Debug, Clone, Copy)]
pub struct FlowSettings {
    pub js: JsSettings,
    /// Keep a trace of every run, not only of failed ones.
    pub tracing: bool,
}

#[derive(Default)]
struct Registry {
    flows: HashMap<String, Arc<FlowDef>>,
    generation: u64,
}

/// A flow run as the documents API asks for it.
#[derive(Debug)]
pub struct FlowRun {
    pub uri: String,
    pub entity: String,
    pub flow: String,
    /// The parsed `trans:options` (an object).
    pub options: serde_json::Map<String, Value>,
    pub job_id: Option<String>,
    pub content: bytes::Bytes,
    /// The format of the content as sent (Content-Type / `format=`).
    pub format: Format,
}

/// A run that produced an envelope.
#[derive(Debug)]
pub struct FlowOutput {
    pub envelope: bytes::Bytes,
    pub format: Format,
    pub job_id: String,
    /// The trace to store with the document (when tracing is on).
    pub trace: Option<(String, Vec<u8>)>,
}

/// A failed run: the error, and the trace to store.
#[derive(Debug)]
pub struct FlowFailure {
    pub error: FlowError,
    pub trace: Option<(String, Vec<u8>)>,
}

pub struct Flows {
    store: Arc<Store>,
    registry: RwLock<Registry>,
    js: JsPool,
    settings: FlowSettings,
}

/// Validate a project completely: layout, properties, main modules, and the syntax of every
/// JavaScript module. Nothing is written.
pub fn prepare(files: &project::Files) -> Result<Project, Vec<String>> {
    let project = project::validate(files)?;
    let mut errors = Vec::new();
    for f in &project.flows {
        if f.code_format == CodeFormat::Sjs {
            let dir = format!("plugins/entities/{}/input/{}/", f.entity, f.flow);
            errors.extend(js::check_syntax(f, &dir));
        }
    }
    if errors.is_empty() {
        Ok(project)
    } else {
        Err(errors)
    }
}

/// The one write that installs a project, replacing every flow deployed before.
pub(crate) fn deploy_op(project: &Project) -> Op {
    let generation = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    let mut entries: Vec<(String, Vec<u8>)> = project
        .flows
        .iter()
        .map(|f| {
            (
                format!("{FLOW_PREFIX}{}", f.key()),
                serde_json::to_vec(f).unwrap_or_default(),
            )
        })
        .collect();
    entries.push((
        GENERATION_KEY.to_string(),
        generation.to_string().into_bytes(),
    ));
    Op::ReplaceTable {
        table: Table::Flows,
        entries,
    }
}

/// Deploy offline (a stopped server's store, or at start-up): validate, then write.
pub fn deploy_blocking(store: &Store, files: &project::Files) -> Result<Project, Vec<String>> {
    let project = prepare(files)?;
    store
        .write_blocking(&Caller::system(), vec![deploy_op(&project)])
        .map_err(|e| vec![e.to_string()])?;
    Ok(project)
}

fn duration_text(ms: f64) -> String {
    format!("PT{:.4}S", ms / 1000.0)
}

impl Flows {
    pub fn open(store: Arc<Store>, settings: FlowSettings) -> Result<Arc<Flows>, StoreError> {
        let flows = Arc::new(Flows {
            store,
            registry: RwLock::new(Registry::default()),
            js: JsPool::new(settings.js),
            settings,
        });
        flows.reload()?;
        Ok(flows)
    }

    /// Read the deployed flows from the store.
    pub fn reload(&self) -> Result<(), StoreError> {
        let mut reg = Registry::default();
        for (key, bytes) in self.store.records(Table::Flows, "")? {
            if key == GENERATION_KEY {
                reg.generation = String::from_utf8_lossy(&bytes).parse().unwrap_or(0);
            } else if let Some(k) = key.strip_prefix(FLOW_PREFIX) {
                match serde_json::from_slice::<FlowDef>(&bytes) {
                    Ok(f) => {
                        reg.flows.insert(k.to_string(), Arc::new(f));
                    }
                    Err(e) => tracing::warn!(flow = k, error = %e, "stored flow ignored"),
                }
            }
        }
        tracing::info!(flows = reg.flows.len(), "flows loaded");
        *self.registry.write() = reg;
        Ok(())
    }

    pub fn deployed(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .registry
            .read()
            .flows
            .values()
            .map(|f| format!("{}:{}", f.entity, f.flow))
            .collect();
        v.sort();
        v
    }

    /// Deploy a project on a running server (admin: checked by the store's table rules).
    pub async fn deploy(
        &self,
        caller: &Caller,
        files: project::Files,
    ) -> Result<Project, FlowError> {
        let project = tokio::task::spawn_blocking(move || prepare(&files))
            .await
            .map_err(|_| FlowError::Deploy(vec!["the deploy check failed".into()]))?
            .map_err(FlowError::Deploy)?;
        self.store.write(caller, vec![deploy_op(&project)]).await?;
        self.reload()?;
        Ok(project)
    }

    /// Run a flow on a document; the envelope to store, or the failure (with its trace).
    pub async fn run(&self, run: FlowRun) -> Result<FlowOutput, FlowFailure> {
        let started = std::time::Instant::now();
        let result = self.run_recorded(run).await;
        crate::metrics::record(|m| {
            let outcome = if result.is_ok() { "ok" } else { "failed" };
            m.flow_runs.with_label_values(&[outcome]).inc();
            m.flow_seconds.observe(started.elapsed().as_secs_f64());
        });
        result
    }

    async fn run_recorded(&self, run: FlowRun) -> Result<FlowOutput, FlowFailure> {
        let (flow, generation) = {
            let reg = self.registry.read();
            match reg.flows.get(&flow_key(&run.entity, &run.flow)) {
                Some(f) => (f.clone(), reg.generation),
                None => {
                    return Err(FlowFailure {
                        error: FlowError::Missing {
                            entity: run.entity,
                            flow: run.flow,
                        },
                        trace: None,
                    });
                }
            }
        };
        let job_id = run
            .job_id
            .clone()
            .filter(|j| !j.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut options = run.options.clone();
        options.insert("entity".into(), json!(flow.entity));
        options.insert("flow".into(), json!(flow.flow));
        options.insert("flowType".into(), json!("input"));
        options.insert("dataFormat".into(), json!(flow.data_format.name()));
        options.insert("jobId".into(), json!(job_id));
        let options = Value::Object(options);

        let text = match std::str::from_utf8(&run.content) {
            Ok(t) => t.to_string(),
            Err(_) => {
                return Err(FlowFailure {
                    error: FlowError::BadContent(
                        "a flow's input must be UTF-8 text (JSON, XML or text)".into(),
                    ),
                    trace: None,
                });
            }
        };
        let raw = if run.format == Format::Json {
            Raw::Json(text)
        } else {
            Raw::Text(text)
        };
        let result = match flow.code_format {
            CodeFormat::Sjs => {
                self.js
                    .run(
                        flow.clone(),
                        generation,
                        run.uri.clone(),
                        raw.clone(),
                        &options,
                        self.settings.tracing,
                    )
                    .await
            }
            CodeFormat::Xqy => default_plugins(&raw),
        };
        let trace_for = |steps: &[Step], error: Option<&js::PluginError>| {
            self.trace_record(&run.uri, &job_id, &flow, &options, steps, error)
        };
        match result {
            RunResult::Failed { error, steps } => {
                let status = PluginStatus::new(error.status.map(u64::from));
                Err(FlowFailure {
                    trace: Some(trace_for(&steps, Some(&error))),
                    error: FlowError::Plugin {
                        status,
                        message: error.message,
                    },
                })
            }
            RunResult::Done { parts, steps } => match build_envelope(flow.data_format, &parts) {
                Ok(envelope) => Ok(FlowOutput {
                    envelope: bytes::Bytes::from(envelope),
                    format: match flow.data_format {
                        DataFormat::Json => Format::Json,
                        DataFormat::Xml => Format::Xml,
                    },
                    trace: self.settings.tracing.then(|| trace_for(&steps, None)),
                    job_id,
                }),
                Err(message) => {
                    let error = js::PluginError {
                        message: message.clone(),
                        status: Some(PluginStatus::BAD_OUTPUT.get()),
                        name: None,
                    };
                    Err(FlowFailure {
                        trace: Some(trace_for(&steps, Some(&error))),
                        error: FlowError::Plugin {
                            status: PluginStatus::BAD_OUTPUT,
                            message,
                        },
                    })
                }
            },
        }
    }

    /// A trace record (docs/contract.md §3) and its store key (`<job id>/<time>-<trace id>`).
    fn trace_record(
        &self,
        uri: &str,
        job_id: &str,
        flow: &FlowDef,
        options: &Value,
        steps: &[Step],
        error: Option<&js::PluginError>,
    ) -> (String, Vec<u8>) {
        let trace_id = uuid::Uuid::new_v4().to_string();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let mut steps_json: Vec<Value> = steps
            .iter()
            .map(|s| {
                json!({
                    "label": s.label,
                    "input": s.input,
                    "output": s.output,
                    "error": s.error,
                    "duration": duration_text(s.duration),
                    "options": options,
                })
            })
            .collect();
        // A failure outside any plugin step (a limit, an envelope fault) is its own step.
        if let Some(e) = error
            && !steps.iter().any(|s| !s.error.is_null())
        {
            steps_json.push(json!({
                "label": "flow",
                "input": null,
                "output": null,
                "error": {"message": e.message, "status": e.status},
                "duration": duration_text(0.0),
                "options": options,
            }));
        }
        let record = json!({"trace": {
            "jobId": job_id,
            "format": flow.data_format.name(),
            "traceId": trace_id,
            "created": crate::time::format_datetime(now),
            "identifier": uri,
            "flowName": flow.flow,
            "flowType": "input",
            "hasError": error.is_some(),
            "steps": steps_json,
        }});
        (
            format!("{job_id}/{now:013}-{trace_id}"),
            serde_json::to_vec(&record).unwrap_or_default(),
        )
    }

    /// The trace records of a job, oldest first.
    pub fn traces(&self, job_id: &str) -> Result<Vec<Value>, StoreError> {
        Ok(self
            .store
            .records(Table::Traces, &format!("{job_id}/"))?
            .into_iter()
            .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
            .collect())
    }

    pub fn time_limit(&self) -> Duration {
        self.settings.js.time_limit
    }
}

/// The default plugins (what `codeFormat=xqy` flows run): identity content, `{}` headers,
/// `[]` triples.
fn default_plugins(raw: &Raw) -> RunResult {
    let content = match raw {
        Raw::Json(t) => serde_json::from_str(t).unwrap_or(Value::String(t.clone())),
        Raw::Text(t) => Value::String(t.clone()),
    };
    let steps = vec![
        Step {
            label: "content".into(),
            input: content.clone(),
            output: content.clone(),
            error: Value::Null,
            duration: 0.0,
        },
        Step {
            label: "headers".into(),
            input: content.clone(),
            output: json!({}),
            error: Value::Null,
            duration: 0.0,
        },
        Step {
            label: "triples".into(),
            input: content.clone(),
            output: json!([]),
            error: Value::Null,
            duration: 0.0,
        },
    ];
    RunResult::Done {
        parts: json!({"content": content, "headers": {}, "triples": []}),
        steps,
    }
}

/// The stored document: an envelope in the flow's data format.
fn build_envelope(format: DataFormat, parts: &Value) -> Result<Vec<u8>, String> {
    if let Some(env) = parts.get("envelope") {
        return match format {
            DataFormat::Json => {
                Ok(serde_json::to_vec(&json!({"envelope": env})).unwrap_or_default())
            }
            DataFormat::Xml => Err("a flow with dataFormat=xml returned a JSON envelope".into()),
        };
    }
    let content = parts.get("content").cloned().unwrap_or(Value::Null);
    let headers = parts.get("headers").cloned().unwrap_or(json!({}));
    let triples = parts.get("triples").cloned().unwrap_or(json!([]));
    match format {
        DataFormat::Json => Ok(serde_json::to_vec(&envelope::json_envelope(
            &content, &headers, &triples,
        ))
        .unwrap_or_default()),
        DataFormat::Xml => {
            let c = match content {
                Value::String(s) if s.trim_start().starts_with('<') => Content::Xml(s),
                other => Content::Json(other),
            };
            envelope::xml_envelope(&c, &headers, &triples)
        }
    }
}
