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
pub struct Toml {
    text: String,
}

impl Toml {
    /// An empty config.
    pub fn new() -> Toml {
        Toml::default()
    }

    /// Any TOML, appended as written (e.g. a `[server]` or `[identity]` section).
    pub fn raw(mut self, text: &str) -> Toml {
        self.text.push_str(text);
        self.text.push('\n');
        self
    }

    /// `[upstreams.NAME]` with these targets.
    pub fn upstream(self, name: &str, targets: &[String]) -> Toml {
        let targets: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
        self.raw(&format!(
            "[upstreams.{name}]\ntargets = [{}]",
            targets.join(", ")
        ))
    }

    /// `[policies.NAME]` with `(plan or total, value)` entries.
    pub fn policy(self, name: &str, entries: &[(&str, &str)]) -> Toml {
        let mut text = format!("[policies.{name}]");
        for (key, value) in entries {
            text.push_str(&format!("\n{key} = {value}"));
        }
        self.raw(&text)
    }

    /// A `[[consumers]]` entry with the sha256 of its key.
    pub fn consumer(self, name: &str, key_sha256: &str) -> Toml {
        self.raw(&format!(
            "[[consumers]]\nname = {name:?}\nkey_sha256 = {key_sha256:?}"
        ))
    }

    /// A `[[routes]]` entry.
    pub fn route(self, route: Route) -> Toml {
        self.raw(&route.text)
    }

    /// The TOML text.
    pub fn build(self) -> String {
        self.text
    }
}

/// A `[[routes]]` entry: `route(name, path_prefix)` and then what it does.
#[derive(Debug, Clone)]
pub struct Route {
    text: String,
}

/// A route named `name` matching `path_prefix`.
pub fn route(name: &str, path_prefix: &str) -> Route {
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

    /// Forwards to upstream `name`.
    pub fn upstream(self, name: &str) -> Route {
        self.line(&format!("upstream = {name:?}"))
    }

    /// Limited by policy `name`.
    pub fn policy(self, name: &str) -> Route {
        self.line(&format!("policy = {name:?}"))
    }

    /// Only for requests to `host`.
    pub fn host(self, host: &str) -> Route {
        self.line(&format!("host = {host:?}"))
    }

    /// Only for these methods.
    pub fn methods(self, methods: &[&str]) -> Route {
        self.line(&format!("methods = {methods:?}"))
    }

    /// Strips the path prefix before forwarding.
    pub fn strip_prefix(self) -> Route {
        self.line("strip_prefix = true")
    }

    /// A direct answer instead of an upstream.
    pub fn respond(self, status: u16, body: &str) -> Route {
        self.line(&format!(
            "respond = {{ status = {status}, body = {body:?} }}"
        ))
    }

    /// Any other line of the route table.
    pub fn with(self, line: &str) -> Route {
        self.line(line)
    }
}
