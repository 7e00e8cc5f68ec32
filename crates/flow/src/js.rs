//! The JavaScript plugin host: a pool of worker threads, each owning a warm QuickJS runtime
//! (rquickjs), so a flow run costs a function call, not a new engine.
//!
//! - Each deployed flow runs in a context of its own, made on its first run in a worker (and
//!   again after a redeploy) with the flow runtime of `prelude.js` and the flow's modules;
//!   `require` between them is CommonJS, and compiled modules stay cached, as in Node, until
//!   the next deploy. Nothing one flow does to its globals or built-ins is visible to another,
//!   and the host's functions are held by the host, not reachable from module code.
//! - Each run has a CPU-time limit (an interrupt handler checks a deadline) and each context
//!   a heap limit. A run that hits either is failed, and its worker gets a fresh runtime.
//! - Jobs reach the workers through a channel; a semaphore bounds how many wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rquickjs::{Context, Function, Object, Persistent, Runtime};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{Semaphore, oneshot};

use super::project::FlowDef;
use crate::error::PluginStatus;

const PRELUDE: &str = include_str!("prelude.js");
/// Jobs that may wait per worker before callers wait for a place.
const QUEUE_PER_WORKER: usize = 64;
/// Flow contexts one worker keeps; past it the least recently run is dropped (and made again
/// when that flow next runs).
const CONTEXTS_PER_WORKER: usize = 64;

#[derive(Debug, Clone, Copy)]
pub struct JsSettings {
    pub workers: usize,
    pub time_limit: Duration,
    pub memory_limit: usize,
}

/// The raw content a flow receives.
#[derive(Debug, Clone)]
pub enum Raw {
    /// JSON text: the plugins get the parsed value.
    Json(String),
    /// XML or text: the plugins get the string.
    Text(String),
}

/// One step of a run, for traces.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
pub struct Step {
    pub label: String,
    pub input: Value,
    pub output: Value,
    pub error: Value,
    /// Milliseconds.
    pub duration: f64,
}

/// What the plugins threw.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct PluginError {
    pub message: String,
    /// The HTTP status the plugin chose: only an error status (400-599) counts.
    #[serde(default, deserialize_with = "error_status")]
    pub status: Option<u16>,
    pub name: Option<String>,
}

/// A plugin's `status`: whatever it threw, only an integer from 400 to 599 is kept.
fn error_status<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    let v = Option::<Value>::deserialize(d)?;
    Ok(v.as_ref()
        .and_then(Value::as_u64)
        .filter(|s| (400..=599).contains(s))
        .and_then(|s| u16::try_from(s).ok()))
}

#[derive(Debug, Clone, PartialEq)]
pub enum RunResult {
    /// `parts` has `content`, `headers`, `triples` (or a finished `envelope`).
    Done { parts: Value, steps: Vec<Step> },
    Failed {
        error: PluginError,
        steps: Vec<Step>,
    },
}

#[derive(Deserialize)]
struct Reply {
    ok: bool,
    parts: Option<Value>,
    error: Option<PluginError>,
    #[serde(default)]
    steps: Vec<Step>,
}

struct Job {
    flow: Arc<FlowDef>,
    generation: u64,
    id: String,
    raw: Raw,
    options: String,
    /// Return the steps of a successful run too (for a trace).
    trace: bool,
    reply: oneshot::Sender<RunResult>,
}

pub struct JsPool {
    jobs: crossbeam_channel::Sender<Job>,
    permits: Arc<Semaphore>,
}

/// One flow's context in a worker.
struct FlowContext {
    /// The prelude's `{install, run, compile}`. Dropped before the context and the runtime
    /// (fields drop in order).
    host: Persistent<Object<'static>>,
    context: Context,
    /// The deploy generation the flow's modules are from.
    generation: u64,
    /// When it last ran, in the worker's run count: the least recent goes first.
    last_run: u64,
}

/// One worker's engine. Fields drop in order: the contexts before the runtime.
struct Engine {
    /// By flow key.
    flows: HashMap<String, FlowContext>,
    runs: u64,
    runtime: Runtime,
    /// Nanoseconds since `epoch` after which the running script is interrupted; 0 = none.
    deadline: Arc<AtomicU64>,
    epoch: Instant,
}

fn failure(message: impl Into<String>, status: Option<u16>) -> PluginError {
    PluginError {
        message: message.into(),
        status,
        name: None,
    }
}

impl Engine {
    fn new(settings: &JsSettings) -> Result<Engine, String> {
        let runtime = Runtime::new().map_err(|e| format!("cannot start QuickJS: {e}"))?;
        runtime.set_memory_limit(settings.memory_limit);
        runtime.set_max_stack_size(1024 * 1024);
        let deadline = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let d = deadline.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || {
            let limit = d.load(Ordering::Relaxed);
            limit != 0 && epoch.elapsed().as_nanos() as u64 > limit
        })));
        Ok(Engine {
            flows: HashMap::new(),
            runs: 0,
            runtime,
            deadline,
            epoch,
        })
    }

    /// A new context with the flow runtime loaded, and its host object.
    fn new_context(&self) -> Result<(Context, Persistent<Object<'static>>), String> {
        let context =
            Context::full(&self.runtime).map_err(|e| format!("cannot start QuickJS: {e}"))?;
        let host = context.with(|ctx| {
            ctx.eval::<Object, _>(PRELUDE)
                .map(|host| Persistent::save(&ctx, host))
                .map_err(|e| format!("the flow runtime does not load: {e}"))
        })?;
        Ok((context, host))
    }

    /// The context of `job`'s flow, made (with the flow's modules) when the flow has none
    /// of its generation yet.
    fn context_for(&mut self, job: &Job) -> Result<&FlowContext, String> {
        let key = job.flow.key();
        self.runs += 1;
        let current = self
            .flows
            .get(&key)
            .is_some_and(|f| f.generation == job.generation);
        if !current {
            // A redeploy replaces the flow's context whole.
            self.flows.remove(&key);
            if self.flows.len() >= CONTEXTS_PER_WORKER
                && let Some(oldest) = self
                    .flows
                    .iter()
                    .min_by_key(|(_, f)| f.last_run)
                    .map(|(k, _)| k.clone())
            {
                self.flows.remove(&oldest);
            }
            let (context, host) = self.new_context()?;
            let sources = serde_json::to_string(&job.flow.modules).unwrap_or_default();
            context.with(|ctx| -> Result<(), String> {
                let host = host.clone().restore(&ctx).map_err(|e| e.to_string())?;
                let install: Function = host.get("install").map_err(|e| e.to_string())?;
                install
                    .call::<_, ()>((key.as_str(), job.generation as f64, sources))
                    .map_err(|e| e.to_string())
            })?;
            self.flows.insert(
                key.clone(),
                FlowContext {
                    host,
                    context,
                    generation: job.generation,
                    last_run: 0,
                },
            );
        }
        let runs = self.runs;
        let flow = self
            .flows
            .get_mut(&key)
            .ok_or_else(|| "the flow's context is gone".to_string())?;
        flow.last_run = runs;
        Ok(flow)
    }

    /// Run one job. `Err` means the engine must be replaced (time or memory limit).
    fn run(&mut self, job: &Job, limit: Duration, memory: usize) -> Result<RunResult, RunResult> {
        let key = job.flow.key();
        let (raw, is_json) = match &job.raw {
            Raw::Json(t) => (t.as_str(), true),
            Raw::Text(t) => (t.as_str(), false),
        };
        let (deadline, epoch) = (self.deadline.clone(), self.epoch);
        deadline.store(
            (epoch.elapsed() + limit).as_nanos() as u64,
            Ordering::Relaxed,
        );
        let deadline_passed =
            || epoch.elapsed().as_nanos() as u64 > deadline.load(Ordering::Relaxed);
        let outcome = self.context_for(job).and_then(|flow| {
            flow.context.with(|ctx| -> Result<String, String> {
                let host = flow.host.clone().restore(&ctx).map_err(|e| e.to_string())?;
                let run: Function = host.get("run").map_err(|e| e.to_string())?;
                run.call::<_, String>((
                    key.as_str(),
                    job.flow.main_module.as_str(),
                    job.id.as_str(),
                    raw,
                    is_json,
                    job.options.as_str(),
                    job.trace,
                ))
                .map_err(|e| {
                    let caught = ctx.catch();
                    caught
                        .as_exception()
                        .and_then(|x| x.message())
                        .or_else(|| caught.as_string().and_then(|s| s.to_string().ok()))
                        .unwrap_or_else(|| e.to_string())
                })
            })
        });
        let timed_out = deadline_passed();
        self.deadline.store(0, Ordering::Relaxed);
        match outcome {
            Ok(text) => {
                match serde_json::from_str::<Reply>(&text) {
                    Ok(Reply {
                        ok: true,
                        parts: Some(parts),
                        steps,
                        ..
                    }) => Ok(RunResult::Done { parts, steps }),
                    // QuickJS's out-of-memory error is catchable; the runner caught it. The
                    // context is suspect after it: report the limit and replace the engine.
                    Ok(Reply {
                        error: Some(e),
                        steps,
                        ..
                    }) if e.message == "out of memory" => Err(RunResult::Failed {
                        error: failure(
                            format!("the flow ran out of memory (limit {memory} bytes)"),
                            None,
                        ),
                        steps,
                    }),
                    Ok(Reply { error, steps, .. }) => Ok(RunResult::Failed {
                        error: error.unwrap_or_else(|| failure("the flow failed", None)),
                        steps,
                    }),
                    Err(e) => Ok(RunResult::Failed {
                        error: failure(format!("the flow's result is not JSON: {e}"), None),
                        steps: Vec::new(),
                    }),
                }
            }
            Err(message) => {
                let error = if timed_out {
                    failure(
                        format!(
                            "the flow ran longer than its limit of {} ms",
                            limit.as_millis()
                        ),
                        None,
                    )
                } else if message.contains("out of memory") {
                    failure(
                        format!("the flow ran out of memory (limit {memory} bytes)"),
                        None,
                    )
                } else {
                    failure(format!("the flow runtime failed: {message}"), None)
                };
                Err(RunResult::Failed {
                    error,
                    steps: Vec::new(),
                })
            }
        }
    }
}

fn worker(rx: crossbeam_channel::Receiver<Job>, settings: JsSettings) {
    let mut engine = match Engine::new(&settings) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "JavaScript worker cannot start");
            for job in rx {
                let _ = job.reply.send(RunResult::Failed {
                    error: failure(e.clone(), None),
                    steps: Vec::new(),
                });
            }
            return;
        }
    };
    for job in rx {
        if job.reply.is_closed() {
            continue;
        }
        let result = match engine.run(&job, settings.time_limit, settings.memory_limit) {
            Ok(r) => r,
            Err(r) => {
                // A limit was hit: the context may be half-way through anything.
                match Engine::new(&settings) {
                    Ok(fresh) => engine = fresh,
                    Err(e) => tracing::error!(error = %e, "cannot restart a JavaScript worker"),
                }
                r
            }
        };
        let _ = job.reply.send(result);
    }
}

impl JsPool {
    pub fn new(settings: JsSettings) -> JsPool {
        let workers = settings.workers.max(1);
        let (tx, rx) = crossbeam_channel::unbounded();
        for i in 0..workers {
            let rx = rx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("js-{i}"))
                .spawn(move || worker(rx, settings));
        }
        JsPool {
            jobs: tx,
            permits: Arc::new(Semaphore::new(workers * QUEUE_PER_WORKER)),
        }
    }

    /// Run a flow's plugins on a pooled context.
    pub async fn run(
        &self,
        flow: Arc<FlowDef>,
        generation: u64,
        id: String,
        raw: Raw,
        options: &Value,
        trace: bool,
    ) -> RunResult {
        let Ok(_permit) = self.permits.acquire().await else {
            return RunResult::Failed {
                error: failure(
                    "the flow runtime is shutting down",
                    Some(PluginStatus::UNAVAILABLE.get()),
                ),
                steps: Vec::new(),
            };
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            flow,
            generation,
            id,
            raw,
            options: options.to_string(),
            trace,
            reply,
        };
        if self.jobs.send(job).is_err() {
            return RunResult::Failed {
                error: failure(
                    "the flow runtime is not running",
                    Some(PluginStatus::UNAVAILABLE.get()),
                ),
                steps: Vec::new(),
            };
        }
        answer.await.unwrap_or_else(|_| RunResult::Failed {
            error: failure(
                "the flow runtime stopped",
                Some(PluginStatus::UNAVAILABLE.get()),
            ),
            steps: Vec::new(),
        })
    }
}

/// Compile every JavaScript module of a flow without running it: syntax errors, by file.
pub(crate) fn check_syntax(flow: &FlowDef, dir: &str) -> Vec<String> {
    let settings = JsSettings {
        workers: 1,
        time_limit: Duration::from_secs(5),
        memory_limit: 256 * 1024 * 1024,
    };
    let (context, host) = match Engine::new(&settings).and_then(|e| e.new_context()) {
        Ok(made) => made,
        Err(e) => return vec![e],
    };
    let mut errors = Vec::new();
    context.with(|ctx| {
        let Ok(compile) = host
            .restore(&ctx)
            .and_then(|host| host.get::<_, Function>("compile"))
        else {
            errors.push("the flow runtime does not load".to_string());
            return;
        };
        for (path, source) in &flow.modules {
            if !(path.ends_with(".sjs") || path.ends_with(".js")) {
                continue;
            }
            let full = format!("{dir}{path}");
            match compile.call::<_, String>((full.as_str(), source.as_str())) {
                Ok(msg) if msg.is_empty() => {}
                Ok(msg) => errors.push(msg),
                Err(e) => errors.push(format!("{full}: {e}")),
            }
        }
    });
    errors
}
