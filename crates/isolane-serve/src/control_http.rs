//! Control while serving over HTTP (docs/serve.md, "Control while serving"): Triton's model
//! repository extension (`POST /v2/repository/models/M/load`, `.../unload`) and isolane's
//! admin routes under `/isolane/v1/` (`GET status`, `POST models/M/resize`), which
//! `isolane ctl` calls. A change builds and warms a model, which takes seconds: it runs on a
//! blocking thread, never on the front end's.

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use crate::http::{error, json, read_body};
use crate::{Change, ControlError, Server};

/// An answer and the model it concerned (for the access log).
pub(crate) type Answered = (Response<Full<Bytes>>, Option<String>);

/// `POST /v2/repository/models/NAME/load` or `.../unload` (`action`). Triton's request body
/// is optional; a load's `parameters` may carry a model configuration or files, which a
/// served scenario's workloads cannot take (400).
pub(crate) async fn repository(
    server: &Server,
    name: &str,
    action: &str,
    request: Request<Incoming>,
) -> Answered {
    let with = |r| (r, Some(name.to_string()));
    let body = match read_body(request, 64 * 1024).await {
        Ok(b) => b,
        Err(e) => return with(error(StatusCode::BAD_REQUEST, e.to_string())),
    };
    if action == "load" {
        if let Err(message) = refuse_load_parameters(&body) {
            return with(error(StatusCode::BAD_REQUEST, message));
        }
    }
    let (server, owned) = (server.clone(), name.to_string());
    let unload = action == "unload";
    let done = tokio::task::spawn_blocking(move || {
        if unload {
            server.unload_model(&owned)
        } else {
            server.load_model(&owned)
        }
    })
    .await;
    with(answer(done))
}

/// `/isolane/v1/...`: `GET status`, `POST models/NAME/resize` with a JSON object of settings
/// (`{"cpu": "2,3", "deadline_ms": 20}`).
pub(crate) async fn admin(
    server: &Server,
    method: &Method,
    rest: &[&str],
    request: Request<Incoming>,
) -> Answered {
    match (method, rest) {
        (&Method::GET, ["status"]) => (
            json(
                StatusCode::OK,
                &serde_json::json!({ "models": server.status() }),
            ),
            None,
        ),
        (&Method::POST, ["models", name, "resize"]) => {
            let name = crate::http::percent_decode(name);
            let with = |r| (r, Some(name.clone()));
            let body = match read_body(request, 64 * 1024).await {
                Ok(b) => b,
                Err(e) => return with(error(StatusCode::BAD_REQUEST, e.to_string())),
            };
            let settings = match settings(&body) {
                Ok(s) => s,
                Err(message) => return with(error(StatusCode::BAD_REQUEST, message)),
            };
            let (server, owned) = (server.clone(), name.clone());
            let done = tokio::task::spawn_blocking(move || server.change(&owned, &settings)).await;
            with(answer(done))
        }
        _ => (
            error(
                StatusCode::NOT_FOUND,
                format!(
                    "no such endpoint: {method} /isolane/v1/{}; served: GET /isolane/v1/status, \
                     POST /isolane/v1/models/NAME/resize",
                    rest.join("/")
                ),
            ),
            None,
        ),
    }
}

fn answer(
    done: Result<Result<Change, ControlError>, tokio::task::JoinError>,
) -> Response<Full<Bytes>> {
    match done {
        Ok(Ok(change)) => json(StatusCode::OK, &change),
        Ok(Err(e)) => error(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            e.message,
        ),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the change's thread failed: {e}"),
        ),
    }
}

/// A resize's body: a JSON object of settings, each a string or a number.
pub(crate) fn settings(body: &[u8]) -> Result<Vec<(String, String)>, String> {
    let expected =
        "expected a JSON object of settings, e.g. {\"cpu\": \"2,3\", \"deadline_ms\": 20}";
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the resize body: {expected}: {e}"))?;
    let Some(map) = value.as_object() else {
        return Err(format!("the resize body: {expected}"));
    };
    map.iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k.clone(), s.clone())),
            serde_json::Value::Number(n) => Ok((k.clone(), n.to_string())),
            _ => Err(format!(
                "the resize body: `{k}` is {v}; {expected} (each value a string or a number)"
            )),
        })
        .collect()
}

/// A load may name no configuration or files of its own: a model is its workload.
fn refuse_load_parameters(body: &[u8]) -> Result<(), String> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(());
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("the load request's body is not JSON: {e}"))?;
    let given = value
        .get("parameters")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    if given.is_empty() {
        return Ok(());
    }
    Err(format!(
        "load parameters ({}) are not taken: a served model is its scenario workload, loaded \
         with the settings it last had; change those with isolane ctl resize",
        given.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_resize_body_is_an_object_of_strings_or_numbers() {
        let s = super::settings(br#"{"cpu": "2,3", "deadline_ms": 20}"#).unwrap();
        assert!(s.contains(&("cpu".into(), "2,3".into())));
        assert!(s.contains(&("deadline_ms".into(), "20".into())));
        let e = super::settings(br#"{"cpu": [2, 3]}"#).unwrap_err();
        assert!(e.contains("`cpu`"), "{e}");
        assert!(super::settings(b"[1]").is_err());
        assert!(super::refuse_load_parameters(b"").is_ok());
        assert!(super::refuse_load_parameters(br#"{"parameters": {}}"#).is_ok());
        let e = super::refuse_load_parameters(br#"{"parameters": {"config": "{}"}}"#).unwrap_err();
        assert!(e.contains("config"), "{e}");
    }
}
