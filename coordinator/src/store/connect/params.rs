//! Reading connection settings: a `postgres://` URL (several hosts
//! included) or libpq's key=value form, decoded into libpq keywords.

/// The URL schemes of a PostgreSQL connection URL.
pub(super) const URL_SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

/// Connection settings read from a URL or a key=value string, decoded.
pub(super) struct ConnParams {
    /// `(keyword, value)` in libpq's keywords, in the order given.
    pub(super) pairs: Vec<(String, String)>,
    /// The URL's password: once percent-decoded it may be any bytes.
    pub(super) url_password: Option<Vec<u8>>,
}

/// Reads a `postgres://user:password@host:port,host:port/database?key=value`
/// URL with the `url` crate. libpq's list of several hosts is no URL syntax,
/// so each entry of the list is read as a URL authority of its own.
pub(super) fn url_params(url: &str) -> Result<ConnParams, String> {
    let parse = |text: &str| url::Url::parse(text).map_err(|e| e.to_string());
    let authority = url.find("://").map_or(0, |i| i + 3);
    // A `/`, `?` or `#` ends the authority; the hosts follow the last `@`.
    let authority_end = url[authority..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| authority + i);
    let hosts_start = url[authority..authority_end]
        .rfind('@')
        .map_or(authority, |i| authority + i + 1);
    let host_list = &url[hosts_start..authority_end];
    let first_host = host_list.split(',').next().unwrap_or_default();
    let parsed = parse(&format!(
        "{}{first_host}{}",
        &url[..hosts_start],
        &url[authority_end..]
    ))?;

    let mut pairs = Vec::new();
    if !parsed.username().is_empty() {
        pairs.push(("user".to_owned(), decode(parsed.username(), "the user")?));
    }
    let url_password = parsed
        .password()
        .map(|p| percent_encoding::percent_decode_str(p).collect());
    if !host_list.is_empty() {
        for entry in host_list.split(',') {
            if entry.is_empty() {
                return Err("empty entry in the host list".to_owned());
            }
            let entry = parse(&format!("postgres://{entry}"))?;
            let host = match entry.host() {
                Some(url::Host::Domain(name)) => decode(name, "the host")?,
                Some(url::Host::Ipv4(ip)) => ip.to_string(),
                Some(url::Host::Ipv6(ip)) => ip.to_string(),
                None => return Err("empty host".to_owned()),
            };
            pairs.push(("host".to_owned(), host));
            pairs.push(("port".to_owned(), entry.port().unwrap_or(5432).to_string()));
        }
    }
    let dbname = parsed.path().strip_prefix('/').unwrap_or(parsed.path());
    if !dbname.is_empty() {
        pairs.push(("dbname".to_owned(), decode(dbname, "the database name")?));
    }
    // Not `query_pairs`: that reads `+` as a space, which libpq does not.
    for pair in parsed.query().unwrap_or_default().split('&') {
        if pair.is_empty() {
            continue;
        }
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            format!(
                "query parameter {:?} has no `=value`",
                percent_encoding::percent_decode_str(pair).decode_utf8_lossy()
            )
        })?;
        let key = decode(key, "a query parameter's name")?;
        let value = decode(value, &format!("the value of {key}"))?;
        pairs.push((key, value));
    }
    Ok(ConnParams { pairs, url_password })
}

/// Percent-decodes one part of a URL.
fn decode(text: &str, what: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("{what} is not UTF-8 once percent-decoded"))
}

/// Reads libpq's key=value form: `keyword = value` pairs separated by
/// whitespace; a value is single-quoted to hold whitespace, and a backslash
/// takes the next character as it is (`\'`, `\\`).
pub(super) fn keyword_params(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    let skip_whitespace = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_whitespace(&mut chars);
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            return Err("`=` without a keyword before it".to_owned());
        }
        skip_whitespace(&mut chars);
        if chars.next() != Some('=') {
            return Err(format!("{key} has no `=` after it"));
        }
        skip_whitespace(&mut chars);
        let quoted = chars.next_if_eq(&'\'').is_some();
        let mut value = String::new();
        let mut closed = false;
        while let Some(c) = chars.next() {
            match c {
                '\'' if quoted => {
                    closed = true;
                    break;
                }
                c if c.is_whitespace() && !quoted => break,
                '\\' => value.extend(chars.next()),
                c => value.push(c),
            }
        }
        if quoted && !closed {
            return Err(format!("the quoted value of {key} has no closing quote"));
        }
        if !quoted && value.is_empty() {
            return Err(format!("{key} has no value"));
        }
        pairs.push((key, value));
    }
}

/// Writes settings back in the key=value form, each value quoted, for
/// tokio-postgres to read.
pub(super) fn conninfo(pairs: &[(String, String)]) -> Result<String, String> {
    let mut text = String::new();
    for (key, value) in pairs {
        if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '=') {
            return Err(format!("unknown option {key:?}"));
        }
        let value = value.replace('\\', "\\\\").replace('\'', "\\'");
        text.push_str(&format!("{key}='{value}' "));
    }
    Ok(text)
}
