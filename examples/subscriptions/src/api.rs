//! The HTTP API. Every write is one transaction: the domain row and its event commit or roll
//! back together.

use std::num::NonZeroU64;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use outbox_runtime::EmitExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::events::{
    Plan, SubscriptionCancelled, SubscriptionCancelledComment, SubscriptionCancelledEffective,
    SubscriptionCancelledReason, SubscriptionCreated, SubscriptionCreatedTrial,
    SubscriptionCreatedTrialCoupon, SubscriptionPlanChanged,
};

/// Seats one customer may hold across active subscriptions. Checked after the write, inside the
/// transaction, so a request past it rolls back its row and its event together.
pub const CUSTOMER_SEAT_LIMIT: i64 = 10_000;

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    /// The service's database.
    pub pool: PgPool,
    /// Renders `/metrics`; `None` when another recorder was installed first.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// The service's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/subscriptions", post(create))
        .route("/v1/subscriptions/{id}", get(show))
        .route("/v1/subscriptions/{id}/plan", post(change_plan))
        .route("/v1/subscriptions/{id}/cancel", post(cancel))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(axum::middleware::from_fn(traced))
        .with_state(state)
}

/// Runs each request in an `http.request` span (kind server), which an event emitted while
/// handling it records as its trace context (with the `opentelemetry` feature). The span
/// continues the caller's trace when the request has a W3C `traceparent` header.
async fn traced(request: Request, next: axum::middleware::Next) -> Response {
    use tracing::Instrument;

    let span = tracing::info_span!(
        "http.request",
        "otel.kind" = "server",
        "http.request.method" = %request.method(),
        "url.path" = request.uri().path(),
        "http.response.status_code" = tracing::field::Empty,
    );
    #[cfg(feature = "opentelemetry")]
    {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        if let Some(caller) = header(outbox_runtime::trace::TRACEPARENT).and_then(|tp| {
            let state = header(outbox_runtime::trace::TRACESTATE);
            outbox_runtime::trace::TraceContext::parse(&tp, state.as_deref())
        }) {
            caller.continue_in(&span);
        }
    }
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}

/// An error answer: `{"error": code, "detail": text}` (plus `violations` for schema errors).
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: serde_json::Value,
}

impl ApiError {
    fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Self {
        Self {
            status,
            body: json!({ "error": code, "detail": detail.into() }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

impl From<outbox_runtime::Error> for ApiError {
    fn from(e: outbox_runtime::Error) -> Self {
        match &e {
            outbox_runtime::Error::InvalidPayload { violations, .. } => Self {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                body: json!({
                    "error": "invalid_event",
                    "detail": e.to_string(),
                    "violations": violations.iter().map(|v| json!({
                        "pointer": v.pointer, "keyword": v.keyword, "message": v.message,
                    })).collect::<Vec<_>>(),
                }),
            },
            _ => {
                tracing::error!(error = %e, "outbox error");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "try again later",
                )
            }
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        tracing::error!(error = %e, "database error");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "try again later",
        )
    }
}

/// `Json<T>` whose rejections are JSON 4xx answers.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(rejection) => Err(match rejection {
                JsonRejection::MissingJsonContentType(_) => ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "send the body as JSON with `Content-Type: application/json`",
                ),
                JsonRejection::JsonSyntaxError(e) => {
                    ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", e.body_text())
                }
                JsonRejection::JsonDataError(e) => ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_body",
                    e.body_text(),
                ),
                other => ApiError::new(StatusCode::BAD_REQUEST, "bad_request", other.body_text()),
            }),
        }
    }
}

/// A path id that must be a UUID: a 404 otherwise (no such subscription can exist).
#[derive(Debug)]
pub struct Id(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        Path::<Uuid>::from_request_parts(parts, state)
            .await
            .map(|Path(id)| Id(id))
            .map_err(|e: PathRejection| {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.body_text())
            })
    }
}

/// `POST /v1/subscriptions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSubscription {
    /// The customer.
    pub customer_id: Uuid,
    /// `free`, `pro` or `enterprise`.
    pub plan: Plan,
    /// Paid seats, 1 to 10,000.
    pub seats: u64,
    /// Days of trial, if any.
    pub trial_days: Option<u16>,
    /// A trial coupon code (`^[A-Z0-9]{4,16}$`).
    pub coupon: Option<String>,
}

/// A subscription as the API shows it.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct Subscription {
    /// Its id.
    pub id: Uuid,
    /// The customer.
    pub customer_id: Uuid,
    /// The plan.
    pub plan: String,
    /// Paid seats.
    pub seats: i32,
    /// `active` or `cancelled`.
    pub status: String,
}

fn invalid(field: &str, detail: impl std::fmt::Display) -> ApiError {
    ApiError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        body: json!({ "error": "invalid_body", "field": field, "detail": detail.to_string() }),
    }
}

async fn create(
    State(state): State<AppState>,
    Body(req): Body<CreateSubscription>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let mut tx = state.pool.begin().await?;
    // an error drops `tx`: the row and its event roll back together, nothing is published
    let opened = open(&mut tx, req).await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "subscription_id": opened.subscription_id,
            "event_id": opened.event_id,
            "status": "active"
        })),
    ))
}

/// What [`open`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    /// The new subscription.
    pub subscription_id: Uuid,
    /// Its `billing.subscription.created` event.
    pub event_id: Uuid,
}

/// Opens a subscription inside `tx`: inserts its row and emits `billing.subscription.created`.
/// The caller commits; on an error it must roll back (or drop) `tx`, which then holds a row
/// and an event that must not commit.
pub async fn open(tx: &mut PgConnection, req: CreateSubscription) -> Result<Opened, ApiError> {
    let seats = NonZeroU64::new(req.seats).ok_or_else(|| invalid("seats", "must be at least 1"))?;
    let seats_db =
        i32::try_from(req.seats).map_err(|_| invalid("seats", "must be at most 10000"))?;
    let coupon = req
        .coupon
        .map(SubscriptionCreatedTrialCoupon::try_from)
        .transpose()
        .map_err(|e| invalid("coupon", format!("{e}: 4 to 16 of A-Z and 0-9")))?;
    if coupon.is_some() && req.trial_days.is_none() {
        return Err(invalid("coupon", "a coupon needs `trial_days`"));
    }
    let now = Utc::now();
    let id = Uuid::now_v7();
    let event = SubscriptionCreated {
        subscription_id: id,
        customer_id: req.customer_id,
        plan: req.plan,
        seats,
        started_at: now,
        trial: req.trial_days.map(|days| SubscriptionCreatedTrial {
            ends_at: now + chrono::Duration::days(i64::from(days)),
            coupon,
        }),
    };

    sqlx::query("insert into subscriptions (id, customer_id, plan, seats) values ($1, $2, $3, $4)")
        .bind(id)
        .bind(req.customer_id)
        .bind(req.plan.to_string())
        .bind(seats_db)
        .execute(&mut *tx)
        .await?;
    // Validated against the schema before the insert: a payload the contract refuses (say,
    // 20,000 seats) is a 422, and the caller's transaction is still usable.
    let event_id = tx.emit_at(event, now).await?;
    let held: i64 = sqlx::query_scalar(
        "select coalesce(sum(seats), 0)::int8 from subscriptions where customer_id = $1 and status = 'active'",
    )
    .bind(req.customer_id)
    .fetch_one(&mut *tx)
    .await?;
    if held > CUSTOMER_SEAT_LIMIT {
        // The caller's rollback takes the subscription row and its event together: nothing
        // is ever published for this request.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "seat_limit",
            format!("the customer would hold {held} seats; the limit is {CUSTOMER_SEAT_LIMIT}"),
        ));
    }
    Ok(Opened {
        subscription_id: id,
        event_id,
    })
}

async fn show(
    State(state): State<AppState>,
    Id(id): Id,
) -> Result<Json<serde_json::Value>, ApiError> {
    let sub: Option<Subscription> = sqlx::query_as(
        "select id, customer_id, plan, seats, status from subscriptions where id = $1",
    )
    .bind(id)
    .fetch_optional(&state.pool)
    .await?;
    let sub = sub.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no subscription {id}"),
        )
    })?;
    let welcome: Option<Uuid> =
        sqlx::query_scalar("select event_id from welcome_intents where subscription_id = $1")
            .bind(id)
            .fetch_optional(&state.pool)
            .await?;
    Ok(Json(
        json!({ "subscription": sub, "welcome_intent_event_id": welcome }),
    ))
}

/// `POST /v1/subscriptions/{id}/plan`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangePlan {
    /// The new plan.
    pub plan: Plan,
}

async fn change_plan(
    State(state): State<AppState>,
    Id(id): Id,
    Body(req): Body<ChangePlan>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut tx = state.pool.begin().await?;
    let current: Option<(String, String)> =
        sqlx::query_as("select plan, status from subscriptions where id = $1 for update")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let (plan, status) = current.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no subscription {id}"),
        )
    })?;
    if status != "active" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_active",
            format!("subscription {id} is {status}"),
        ));
    }
    let from_plan: Plan = plan.parse().map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            "unknown_plan",
            format!("stored plan `{plan}` is not in the contract"),
        )
    })?;
    if from_plan == req.plan {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "same_plan",
            format!("subscription {id} is already on {plan}"),
        ));
    }
    sqlx::query("update subscriptions set plan = $2 where id = $1")
        .bind(id)
        .bind(req.plan.to_string())
        .execute(&mut *tx)
        .await?;
    let event_id = tx
        .emit(SubscriptionPlanChanged {
            subscription_id: id,
            from_plan,
            to_plan: req.plan,
            changed_at: Utc::now(),
            proration: None,
        })
        .await?;
    tx.commit().await?;
    Ok(Json(
        json!({ "subscription_id": id, "event_id": event_id, "plan": req.plan }),
    ))
}

/// `POST /v1/subscriptions/{id}/cancel`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cancel {
    /// `customer_request`, `payment_failed` or `fraud`.
    pub reason: SubscriptionCancelledReason,
    /// `immediately` (default) or `end_of_period`.
    pub effective: Option<SubscriptionCancelledEffective>,
    /// A note, at most 500 characters.
    pub comment: Option<String>,
}

async fn cancel(
    State(state): State<AppState>,
    Id(id): Id,
    Body(req): Body<Cancel>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let comment = req
        .comment
        .map(SubscriptionCancelledComment::try_from)
        .transpose()
        .map_err(|e| invalid("comment", e))?;
    let mut tx = state.pool.begin().await?;
    let updated = sqlx::query(
        "update subscriptions set status = 'cancelled' where id = $1 and status = 'active'",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 0 {
        let exists: bool =
            sqlx::query_scalar("select exists(select 1 from subscriptions where id = $1)")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
        return Err(if exists {
            ApiError::new(
                StatusCode::CONFLICT,
                "not_active",
                format!("subscription {id} is already cancelled"),
            )
        } else {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no subscription {id}"),
            )
        });
    }
    let event_id = tx
        .emit(SubscriptionCancelled {
            subscription_id: id,
            reason: req.reason,
            effective: req
                .effective
                .unwrap_or(SubscriptionCancelledEffective::Immediately),
            cancelled_at: Utc::now(),
            comment,
        })
        .await?;
    tx.commit().await?;
    Ok(Json(
        json!({ "subscription_id": id, "event_id": event_id, "status": "cancelled" }),
    ))
}

async fn metrics(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => handle.render().into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "no_metrics",
            "metrics recorder not installed",
        )
        .into_response(),
    }
}

async fn healthz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    sqlx::query("select 1").execute(&state.pool).await?;
    Ok("ok")
}
