//! The JavaScript plugin host: a pool of worker threads, each owning a warm QuickJS runtime
//! (rquickjs) with the flow runtime of `prelude.js` loaded, so a flow run costs a function
//! call, not a new engine.
//!
//! - A flow's modules are installed into a worker's context on first use (and again after a
//!   redeploy); `require` between them is CommonJS, and compiled modules stay cached, as in
//!   Node, until the next deploy.
//! - Each run has a CPU-time limit (an interrupt handler checks a deadline) and each context
//!   a heap limit. A run that hits either is failed, and its worker gets a fresh runtime.
//! - Jobs reach the workers through a channel; a semaphore bounds how many wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rquickjs::{Context, Function, Runtime};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{Semaphore, oneshot};

use super::project::FlowDef;

const PRELUDE: &str = include_str!("prelude.js");
/// Jobs that may wait per worker before callers wait for a place.
const QUEUE_PER_WORKER: usize = 64;

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
    pub status: Option<u16>,
    pub name: Option<String>,
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

/// One worker's engine.
struct Engine {
    _runtime: Runtime,
    context: Context,
    /// Flow key -> installed generation.
    installed: HashMap<String, u64>,
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
        let context = Context::full(&runtime).map_err(|e| format!("cannot start QuickJS: {e}"))?;
        context.with(|ctx| {
            ctx.eval::<(), _>(PRELUDE)
                .map_err(|e| format!("the flow runtime does not load: {e}"))
        })?;
        Ok(Engine {
            _runtime: runtime,
            context,
            installed: HashMap::new(),
            deadline,
            epoch,
        })
    }

    /// Run one job. `Err` means the engine must be replaced (time or memory limit).
    fn run(&mut self, job: &Job, limit: Duration, memory: usize) -> Result<RunResult, RunResult> {
        let key = job.flow.key();
        let installed = self.installed.get(&key).copied();
        let (raw, is_json) = match &job.raw {
            Raw::Json(t) => (t.as_str(), true),
            Raw::Text(t) => (t.as_str(), false),
        };
        self.deadline.store(
            (self.epoch.elapsed() + limit).as_nanos() as u64,
            Ordering::Relaxed,
        );
        let deadline_passed =
            || self.epoch.elapsed().as_nanos() as u64 > self.deadline.load(Ordering::Relaxed);
        let outcome = self.context.with(|ctx| -> Result<String, String> {
            let globals = ctx.globals();
            if installed != Some(job.generation) {
                let install: Function = globals.get("__installFlow").map_err(|e| e.to_string())?;
                let sources = serde_json::to_string(&job.flow.modules).unwrap_or_default();
                install
                    .call::<_, ()>((key.as_str(), job.generation as f64, sources))
                    .map_err(|e| e.to_string())?;
            }
            let run: Function = globals.get("__runFlow").map_err(|e| e.to_string())?;
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
        });
        let timed_out = deadline_passed();
        self.deadline.store(0, Ordering::Relaxed);
        match outcome {
            Ok(text) => {
                self.installed.insert(key, job.generation);
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
                error: failure("the flow runtime is shutting down", Some(503)),
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
                error: failure("the flow runtime is not running", Some(503)),
                steps: Vec::new(),
            };
        }
        answer.await.unwrap_or_else(|_| RunResult::Failed {
            error: failure("the flow runtime stopped", Some(503)),
            steps: Vec::new(),
        })
    }
}

/// Compile every JavaScript module of a flow without running it: syntax errors, by file.
pub fn check_syntax(flow: &FlowDef, dir: &str) -> Vec<String> {
    let settings = JsSettings {
        workers: 1,
        time_limit: Duration::from_secs(5),
        memory_limit: 256 * 1024 * 1024,
    };
    let engine = match Engine::new(&settings) {
        Ok(e) => e,
        Err(e) => return vec![e],
    };
    let mut errors = Vec::new();
    engine.context.with(|ctx| {
        let Ok(compile) = ctx.globals().get::<_, Function>("__compile") else {
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
