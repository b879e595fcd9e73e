//! `sluice man`: the whole manual page, in roff. clap's page names the subcommands
//! only; this one gives each its synopsis and options, and adds what a reader of a
//! man page looks for and the command line cannot tell: the environment, the files,
//! the signals, the exit status and where the rest is documented.

use std::io::Write;

use clap::Command;

/// The sections after the subcommands, in roff.
const AFTER: &str = r#".SH ENVIRONMENT
.TP
\fBSLUICE_CONFIG\fR
The config file when \fB\-c\fR is not given (then \fI./gateway.toml\fR).
.TP
\fBSLUICE_LOG\fR
sluice's own log level on stderr (\fBinfo\fR by default: \fBdebug\fR, \fBwarn\fR ...), or a full filter such as \fBsluice=debug,h2=trace\fR.
.TP
\fBenv:NAME\fR
Secrets in the config (\fBtoken = "env:SLUICE_ADMIN_TOKEN"\fR, \fBsecret = "env:JWT_SECRET"\fR) are read from the environment variable NAME at start and at each reload; \fBsluice check\fR needs them set too.
.SH FILES
.TP
\fIgateway.toml\fR
The config: listeners, identity, store, upstreams, policies, consumers and routes. Watched: a change is reloaded without a restart, or refused with its file, line and reason while the old config keeps serving.
.TP
\fIconsumers.jsonl\fR
\fB[identity] consumers_file\fR: one consumer a line, as JSON; watched and swapped like the config. \fBsluice hash\-key \-\-batch\fR writes its lines.
.TP
\fIsluice.state\fR
\fB[store] state_file\fR: the memory store's counters and bans, so a restart keeps quotas.
.SH SIGNALS
.TP
\fBSIGHUP\fR
Reload the config now (as a change of the file does).
.TP
\fBSIGTERM\fR, \fBSIGINT\fR
Drain: stop accepting, let requests in flight finish for \fB[server] drain_timeout\fR, then exit.
.SH "EXIT STATUS"
.TP
\fB0\fR
Success: \fBcheck\fR found no error, \fBhealth\fR got 200 from /readyz, \fBrun\fR drained and stopped.
.TP
\fB1\fR
Failure: the config has errors (each printed with its file, line, key and reason), the gateway could not start, or /readyz did not answer 200.
.TP
\fB2\fR
The command line could not be read.
.SH "ACCESS LOG"
One line per request on stdout (JSON by default, \fB[log] access\fR); a refusal flood writes a line per caller, route and outcome a second, the rest counted in \fBrepeated\fR (\fB[log] refused\fR). sluice's own logs go to stderr.
.SH "SEE ALSO"
The documentation beside the binary's source: README.md, docs/configuration.md (every key), docs/operations.md (metrics, access log, admin API), docs/fleet.md (Redis), docs/identity.md, docs/limits.md.
"#;

/// Writes the page of `cli` to `out`.
pub(crate) fn render(cli: Command, out: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cli.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    writeln!(out, ".SH COMMANDS")?;
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        writeln!(out, ".SS \"sluice {}\"", sub.get_name())?;
        let about = (sub.get_long_about().or(sub.get_about())).map(ToString::to_string);
        writeln!(out, "{}", escape(&about.unwrap_or_default()))?;
        for arg in sub
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !a.is_global_set())
        {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let name = match (arg.get_long(), arg.is_positional()) {
                (Some(long), _) => format!("\\fB\\-\\-{}\\fR", escape(long)),
                (None, _) => format!("\\fI{}\\fR", escape(&id.to_uppercase())),
            };
            writeln!(out, ".TP\n{name}")?;
            let help = (arg.get_long_help().or(arg.get_help())).map(ToString::to_string);
            writeln!(out, "{}", escape(&help.unwrap_or_default()))?;
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .map(|v| v.get_name().to_string())
                .collect();
            if !values.is_empty() {
                writeln!(out, ".br\nOne of: {}.", escape(&values.join(", ")))?;
            }
        }
    }
    out.write_all(AFTER.as_bytes())?;
    man.render_version_section(out)
}

/// `text` for a roff text line: backslashes and hyphens escaped, and a line that
/// would start with a control character (`.` or `'`) protected.
fn escape(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('-', "\\-");
    match escaped.starts_with(['.', '\'']) {
        true => format!("\\&{escaped}"),
        false => escaped,
    }
}
