//! Input flows over HTTP: the flow path of `PUT /v1/documents`, `POST /v1/deploy` and
//! `GET /v1/traces` (docs/contract.md §3).

use bytes::Bytes;

use super::Ctx;
use super::response::{self, Resp};
use super::{App, BoxError, read_body, require_any};
use crate::acl::Role;
use crate::error::{ApiError, ErrorCode};
use crate::flow::{FlowFailure, FlowRun};
use crate::store::{Op, PutDocument, Table};

/// The flow a write names with `trans:entity-name`, `trans:flow-name`, `trans:options` and
/// `trans:job-id`.
pub(super) struct FlowParams {
    entity: String,
    flow: String,
    options: serde_json::Map<String, serde_json::Value>,
    job_id: Option<String>,
}

impl FlowParams {
    /// The flow a write asks for with `transform`, if any: a transform that is not a flow,
    /// or a flow without its parameters, is refused before the body is read.
    pub(super) fn requested(ctx: &Ctx) -> Result<Option<FlowParams>, ApiError> {
        match ctx.params.get("transform") {
            None => Ok(None),
            Some(t) if crate::flow::is_flow_transform(t) => FlowParams::of(ctx).map(Some),
            Some(t) => Err(ApiError::new(
                ErrorCode::InvalidParam,
                format!("unknown transform: {t}"),
            )),
        }
    }

    fn of(ctx: &Ctx) -> Result<FlowParams, ApiError> {
        let entity = ctx.params.required("trans:entity-name")?.to_string();
        let flow = ctx.params.required("trans:flow-name")?.to_string();
        let options = match ctx.params.get("trans:options").map(str::trim) {
            None | Some("") => serde_json::Map::new(),
            Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(serde_json::Value::Object(m)) => m,
                Ok(_) => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidType,
                        "trans:options must be a JSON object",
                    ));
                }
                Err(e) => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidParam,
                        format!("trans:options is not valid JSON: {e}"),
                    ));
                }
            },
        };
        Ok(FlowParams {
            entity,
            flow,
            options,
            job_id: ctx.params.get("trans:job-id").map(str::to_string),
        })
    }

    /// One job for every document of a bulk write: the one named, else a new one.
    pub(super) fn one_job(mut self) -> FlowParams {
        self.job_id
            .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
        self
    }
}

/// The trace record a flow run leaves, as a store operation.
fn trace_op((key, record): (String, Vec<u8>)) -> Op {
    Op::PutRecord {
        table: Table::Traces,
        key,
        value: record,
    }
}

/// Run the flow on `put`: the write of its envelope in the document's place and of its
/// trace, or the failure and the write of its trace.
pub(super) async fn through_flow(
    app: &App,
    params: &FlowParams,
    put: PutDocument,
) -> Result<Vec<Op>, (ApiError, Option<Op>)> {
    let run = FlowRun {
        uri: put.uri.clone(),
        entity: params.entity.clone(),
        flow: params.flow.clone(),
        options: params.options.clone(),
        job_id: params.job_id.clone(),
        content: put.content.clone(),
        format: put.format,
    };
    match app.flows.run(run).await {
        Ok(out) => {
            let mut ops = vec![Op::PutDocument(PutDocument {
                content: out.envelope,
                format: out.format,
                ..put
            })];
            ops.extend(out.trace.map(trace_op));
            Ok(ops)
        }
        Err(FlowFailure { error, trace }) => Err((error.into(), trace.map(trace_op))),
    }
}

/// Store the traces of runs whose writes are not made (a failure), logging what cannot be.
pub(super) async fn keep_traces(app: &App, ctx: &Ctx, traces: Vec<Op>) {
    if traces.is_empty() {
        return;
    }
    if let Err(e) = app.store.write(&ctx.caller, traces).await {
        tracing::error!(error = %e, "cannot store a flow trace");
    }
}

/// Run the named flow on a document and store the envelope in its place (called by
/// `documents::put` with the write it would have made).
pub(super) async fn put_through_flow(
    app: &App,
    ctx: &Ctx,
    params: &FlowParams,
    put: PutDocument,
) -> Result<Resp, ApiError> {
    let uri = put.uri.clone();
    match through_flow(app, params, put).await {
        Ok(ops) => {
            let answer = app.store.write(&ctx.caller, ops).await?;
            Ok(response::written(&uri, &answer))
        }
        Err((error, trace)) => {
            // Nothing is stored but the trace of the failure.
            keep_traces(app, ctx, trace.into_iter().collect()).await;
            Err(error)
        }
    }
}

/// `POST /v1/deploy`: a tar or zip of a project, validated whole, then applied atomically.
pub(super) async fn deploy<B>(app: &App, ctx: &Ctx, body: B) -> Result<Resp, ApiError>
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin,
    B::Error: Into<BoxError>,
{
    require_any(&ctx.caller, &[Role::Admin])?;
    ctx.params.only(&ctx.path, |_| false)?;
    let body = read_body(app, &ctx.headers, body).await?;
    let files = crate::flow::project::read_archive(&body)
        .map_err(|errors| ApiError::new(ErrorCode::InvalidRequest, errors.join("; ")))?;
    let project = app.flows.deploy(&ctx.caller, files).await?;
    for w in &project.warnings {
        tracing::warn!("{w}");
    }
    let flows: Vec<String> = project
        .flows
        .iter()
        .map(|f| format!("{}:{}", f.entity, f.flow))
        .collect();
    Ok(response::json_value(
        200,
        &serde_json::json!({"deployed": flows, "warnings": project.warnings}),
    ))
}

/// `GET /v1/traces?job-id=…`: the trace records of a job (admin).
pub(super) fn traces(app: &App, ctx: &Ctx) -> Result<Resp, ApiError> {
    require_any(&ctx.caller, &[Role::Admin])?;
    ctx.params.only(&ctx.path, |k| k == "job-id")?;
    let job = ctx.params.required("job-id")?;
    let traces = app.flows.traces(job)?;
    Ok(response::json_value(
        200,
        &serde_json::json!({"jobId": job, "traces": traces}),
    ))
}
