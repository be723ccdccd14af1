//! The inspector console at `/ui`: a dependency-free page set embedded in the binary,
//! talking to the public REST API only. Served with a Content-Security-Policy that
//! admits the page's own script and style and nothing inline.

use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, web};

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Only the page's own files, no inline script or style, no framing, and requests only
/// to this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    let mut response = HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .insert_header((header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")))
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")))
        .body(body);
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX)
}

async fn script() -> HttpResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE)
}

pub fn register(config: &mut web::ServiceConfig) {
    config
        .route("/ui", web::get().to(index))
        .route("/ui/", web::get().to(index))
        .route("/ui/assets/app.js", web::get().to(script))
        .route("/ui/assets/app.css", web::get().to(style));
}
