//! `gateway.toml` built in code, so a test states only what differs:
//!
//! ```ignore
//! let toml = Toml::new()
//!     .upstream("up", &[up.url()])
//!     .policy("p", &[("anonymous", "{ per_minute = 10 }")])
//!     .route(route("api", "/api").upstream("up").policy("p"))
//!     .build();
//! ```
//!
//! It renders plain TOML that the real config compiler reads; `raw` adds anything the
//! builder has no method for.

/// A config under construction.
#[derive(Debug, Default, Clone)]
pub(crate) struct Toml {
    text: String,
}

impl Toml {
    pub(crate) fn new() -> Toml {
        Toml::default()
    }

    /// Any TOML, appended as written (e.g. a `[server]` or `[identity]` section).
    pub(crate) fn raw(mut self, text: &str) -> Toml {
        self.text.push_str(text);
        self.text.push('\n');
        self
    }

    /// `[upstreams.NAME]` with these targets.
    pub(crate) fn upstream(self, name: &str, targets: &[String]) -> Toml {
        let targets: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
        self.raw(&format!(
            "[upstreams.{name}]\ntargets = [{}]",
            targets.join(", ")
        ))
    }

    /// `[policies.NAME]` with `(plan or total, value)` entries.
    pub(crate) fn policy(self, name: &str, entries: &[(&str, &str)]) -> Toml {
        let mut text = format!("[policies.{name}]");
        for (key, value) in entries {
            text.push_str(&format!("\n{key} = {value}"));
        }
        self.raw(&text)
    }

    /// A `[[consumers]]` entry with the sha256 of its key.
    pub(crate) fn consumer(self, name: &str, key_sha256: &str) -> Toml {
        self.raw(&format!(
            "[[consumers]]\nname = {name:?}\nkey_sha256 = {key_sha256:?}"
        ))
    }

    pub(crate) fn route(self, route: Route) -> Toml {
        self.raw(&route.text)
    }

    pub(crate) fn build(self) -> String {
        self.text
    }
}

/// A `[[routes]]` entry: `route(name, path_prefix)` and then what it does.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    text: String,
}

pub(crate) fn route(name: &str, path_prefix: &str) -> Route {
    Route {
        text: format!("[[routes]]\nname = {name:?}\npath_prefix = {path_prefix:?}"),
    }
}

impl Route {
    fn line(mut self, line: &str) -> Route {
        self.text.push('\n');
        self.text.push_str(line);
        self
    }

    pub(crate) fn upstream(self, name: &str) -> Route {
        self.line(&format!("upstream = {name:?}"))
    }

    pub(crate) fn policy(self, name: &str) -> Route {
        self.line(&format!("policy = {name:?}"))
    }

    pub(crate) fn host(self, host: &str) -> Route {
        self.line(&format!("host = {host:?}"))
    }

    pub(crate) fn methods(self, methods: &[&str]) -> Route {
        self.line(&format!("methods = {methods:?}"))
    }

    pub(crate) fn strip_prefix(self) -> Route {
        self.line("strip_prefix = true")
    }

    /// A direct answer instead of an upstream.
    pub(crate) fn respond(self, status: u16, body: &str) -> Route {
        self.line(&format!(
            "respond = {{ status = {status}, body = {body:?} }}"
        ))
    }

    /// Any other line of the route table.
    pub(crate) fn with(self, line: &str) -> Route {
        self.line(line)
    }
}
