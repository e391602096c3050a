//! `GET /config`: the effective [`RunConfig`] as JSON, every default written out.
//!
//! Built field by field rather than derived, so a secret added to the configuration later
//! does not appear here by accident: tokens never do (the admin token file's *path* does, as
//! do kubeconfig paths and Secret names; their contents stay on disk).

use serde_json::{Value, json};

use crate::run::{RunConfig, TlsSource};

/// The configuration, redacted.
pub fn config_json(cfg: &RunConfig) -> Value {
    let tls = match &cfg.tls {
        TlsSource::Files { cert, key } => json!({
            "mode": "files",
            "cert": cert.display().to_string(),
            "key": key.display().to_string(),
        }),
        TlsSource::SelfSigned => json!({ "mode": "selfSigned" }),
        TlsSource::InsecureHttp => json!({ "mode": "insecureHttp" }),
    };
    // The links file holds no secret: a remote is a kubeconfig path or a Secret's name.
    let links = serde_json::to_value(&cfg.links.links).unwrap_or(Value::Null);
    json!({
        "links": links,
        "listen": cfg.listen.to_string(),
        "adminListen": cfg.admin_listen.to_string(),
        "stateDir": cfg.state_dir.display().to_string(),
        "tls": tls,
        "tlsHosts": cfg.hosts,
        "adminTokenFile": cfg.admin_token_file.as_ref().map(|p| p.display().to_string()),
        "mutatingRoutes": if cfg.admin_token_file.is_some() { "enabled" } else { "disabled" },
        "facadeLimits": cfg.serve,
    })
}
