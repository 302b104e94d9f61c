//! The egress allow list: which `host:port` a confined worker may reach through zergd's proxy.
//!
//! A rule is `name` (ports 443 and 80), `name:port`, `*.suffix` (any name under it, not the
//! suffix itself) or `*.suffix:port`; an IP literal is a name like any other (`[::1]:8080`).
//! Names are compared without case and without a trailing dot.

/// The hosts the model provider's CLI needs, from the agent's environment: the Anthropic API
/// and its login hosts (or `ANTHROPIC_BASE_URL`'s host, and the cloud providers' when Claude
/// Code is set to use Bedrock or Vertex), and OpenAI's for the `codex` profile.
pub fn provider_hosts(var: impl Fn(&str) -> Option<String>, profile: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let set = |k: &str| var(k).is_some_and(|v| !v.is_empty() && v != "0");
    if profile == "codex" {
        out.extend(["api.openai.com", "chatgpt.com", "auth.openai.com"].map(String::from));
        if let Some(u) = var("OPENAI_BASE_URL").and_then(|u| url_host_port(&u)) {
            out.push(u);
        }
    } else {
        out.extend(
            [
                "api.anthropic.com",
                "console.anthropic.com",
                "statsig.anthropic.com",
                "claude.ai",
            ]
            .map(String::from),
        );
        if let Some(u) = var("ANTHROPIC_BASE_URL").and_then(|u| url_host_port(&u)) {
            out.push(u);
        }
        if set("CLAUDE_CODE_USE_BEDROCK") {
            out.push("*.amazonaws.com".into());
        }
        if set("CLAUDE_CODE_USE_VERTEX") {
            out.push("*.googleapis.com".into());
        }
    }
    out
}

/// `host:port` of an `http://` or `https://` URL (the scheme's port when none is given).
pub fn url_host_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let (host, port) = split_host_port(authority, default)?;
    Some(join(&host, port))
}

/// Splits `host[:port]` (with `[v6]` brackets) into a normalised name and a port.
pub fn split_host_port(s: &str, default_port: u16) -> Option<(String, u16)> {
    let s = s.trim();
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (h.to_string(), port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_string(), p.parse().ok()?),
            Some(_) => (s.to_string(), default_port),
            None => (s.to_string(), default_port),
        }
    };
    let host = normalise(&host);
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:*".contains(&b));
    (valid && port != 0).then_some((host, port))
}

fn normalise(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Whether `host:port` is allowed by any of `rules`.
pub fn allowed(rules: &[String], host: &str, port: u16) -> bool {
    let host = normalise(host);
    rules.iter().any(|r| rule_matches(r, &host, port))
}

fn rule_matches(rule: &str, host: &str, port: u16) -> bool {
    let rule = rule.trim();
    // A port is given when what follows the name (or the `[v6]`) is `:digits`.
    let has_port = match rule.strip_prefix('[') {
        Some(rest) => rest.contains("]:"),
        None => rule.matches(':').count() == 1,
    };
    let Some((name, rport)) = split_host_port(rule, 443) else {
        return false;
    };
    let port_ok = if has_port {
        rport == port
    } else {
        port == 443 || port == 80
    };
    let name_ok = match name.strip_prefix("*.") {
        Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
        None => name == host,
    };
    port_ok && name_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_names_ports_and_suffixes() {
        let rules = vec![
            "api.anthropic.com".to_string(),
            "127.0.0.1:8080".into(),
            "*.pythonhosted.org".into(),
            "[::1]:9000".into(),
        ];
        assert!(allowed(&rules, "API.anthropic.com.", 443));
        assert!(!allowed(&rules, "api.anthropic.com", 22));
        assert!(allowed(&rules, "127.0.0.1", 8080));
        assert!(!allowed(&rules, "127.0.0.1", 8081));
        assert!(allowed(&rules, "files.pythonhosted.org", 443));
        assert!(!allowed(&rules, "pythonhosted.org", 443));
        assert!(!allowed(&rules, "evilpythonhosted.org", 443));
        assert!(allowed(&rules, "::1", 9000));
        assert!(!allowed(&rules, "example.com", 443));
        assert!(!allowed(&[], "api.anthropic.com", 443));
    }

    #[test]
    fn provider_hosts_come_from_the_agents_environment() {
        let env = |k: &str| match k {
            "ANTHROPIC_BASE_URL" => Some("http://127.0.0.1:4010/v1".to_string()),
            _ => None,
        };
        let h = provider_hosts(env, "claude");
        assert!(h.contains(&"127.0.0.1:4010".to_string()), "{h:?}");
        assert!(h.contains(&"api.anthropic.com".to_string()));
        let codex = provider_hosts(|_| None, "codex");
        assert!(codex.contains(&"api.openai.com".to_string()));
        assert_eq!(
            url_host_port("https://user:pw@[::1]/x").as_deref(),
            Some("[::1]:443")
        );
        assert_eq!(url_host_port("ftp://x"), None);
        assert_eq!(split_host_port("a b:80", 443), None);
    }
}
