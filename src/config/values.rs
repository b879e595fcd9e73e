//! Scalar values of `gateway.toml`: bounded integers, durations, socket addresses and
//! CIDRs, each parsed with a diagnostic (file, line, key, reason) when it is wrong.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;
use toml::Spanned;

use super::diagnostic::Diagnostics;
use super::duration;

pub(super) fn int_in(
    d: &mut Diagnostics,
    key: &str,
    value: &Spanned<i64>,
    min: i64,
    max: i64,
) -> Option<i64> {
    let v = *value.get_ref();
    if v < min || v > max {
        d.error(
            Some(value.span()),
            key,
            format!("must be between {min} and {max}, got {v}"),
        );
        return None;
    }
    Some(v)
}

pub(super) fn duration_of(
    d: &mut Diagnostics,
    key: &str,
    value: Option<&Spanned<String>>,
    default: Duration,
) -> Duration {
    match value {
        None => default,
        Some(v) => duration::parse(v.get_ref()).unwrap_or_else(|reason| {
            d.error(Some(v.span()), key, reason);
            default
        }),
    }
}

pub(super) fn socket_addr(
    d: &mut Diagnostics,
    key: &str,
    value: &Spanned<String>,
) -> Option<SocketAddr> {
    value
        .get_ref()
        .parse()
        .map_err(|_| {
            d.error(
                Some(value.span()),
                key,
                format!(
                    "\"{}\" is not an address:port such as \"0.0.0.0:8080\"",
                    value.get_ref()
                ),
            )
        })
        .ok()
}

pub(super) fn cidr(d: &mut Diagnostics, key: &str, value: &Spanned<String>) -> Option<IpNet> {
    let text = value.get_ref().trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| {
            d.error(
                Some(value.span()),
                key,
                format!("\"{text}\" is not a CIDR such as \"10.0.0.0/8\" or an IP address"),
            )
        })
        .ok()
}

pub(super) fn cidrs(
    d: &mut Diagnostics,
    key: &str,
    values: Option<Vec<Spanned<String>>>,
) -> Vec<IpNet> {
    values
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, v)| cidr(d, &format!("{key}[{i}]"), v))
        .collect()
}
