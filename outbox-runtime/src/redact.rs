//! Secrets out of messages: the one redaction of connection URLs used by every error and log
//! line of this crate and of the `outbox` command.

/// `url` with its password (and any `password=` query value) replaced by `***`. A NATS URL's
/// lone user part is a token, so it is replaced too.
///
/// ```
/// use outbox_runtime::redact;
///
/// assert_eq!(
///     redact::url("postgres://app:s3cret@db:5432/billing?sslmode=require"),
///     "postgres://app:***@db:5432/billing?sslmode=require"
/// );
/// assert_eq!(
///     redact::url("postgres://app@db/billing?password=s3cret&sslmode=verify-full"),
///     "postgres://app@db/billing?password=***&sslmode=verify-full"
/// );
/// assert_eq!(redact::url("nats://tok3n@127.0.0.1:4222"), "nats://***@127.0.0.1:4222");
/// ```
pub fn url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None if scheme.starts_with("nats") || scheme == "tls" => format!("***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_owned(),
    };
    let tail = tail
        .split('&')
        .map(|part| match part.split_once("password=") {
            Some((head, _)) => format!("{head}password=***"),
            None => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{scheme}://{authority}{tail}")
}

/// `text` (an error message that may quote it) without the password of `url`, in the URL's
/// user part or in a `password=` query value.
///
/// ```
/// assert_eq!(
///     outbox_runtime::redact::password_in("auth failed: s3cret", "postgres://a:s3cret@h/db"),
///     "auth failed: ***"
/// );
/// ```
pub fn password_in(text: &str, url: &str) -> String {
    let Some((_, rest)) = url.split_once("://") else {
        return text.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let in_userinfo = authority
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, p)| p);
    let in_query = tail
        .split(['?', '&'])
        .find_map(|part| part.strip_prefix("password="));
    let mut text = text.to_owned();
    for password in [in_userinfo, in_query].into_iter().flatten() {
        if !password.is_empty() {
            text = text.replace(password, "***");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_everything_but_the_secrets() {
        assert_eq!(
            redact_all("nats://u:p@127.0.0.1:4222"),
            "nats://u:***@127.0.0.1:4222"
        );
        assert_eq!(
            redact_all("postgres://root@127.0.0.1/test"),
            "postgres://root@127.0.0.1/test"
        );
        assert_eq!(redact_all("not a url"), "not a url");
        assert_eq!(
            redact_all("postgres://h/db?sslmode=require&password=x&user=a"),
            "postgres://h/db?sslmode=require&password=***&user=a"
        );
    }

    fn redact_all(u: &str) -> String {
        url(u)
    }

    #[test]
    fn error_texts_lose_the_password_wherever_the_url_had_it() {
        assert_eq!(
            password_in(
                "password authentication failed: s3cret",
                "postgres://a:s3cret@h/db"
            ),
            "password authentication failed: ***"
        );
        assert_eq!(
            password_in(
                "bad password hunter2",
                "postgres://a@h/db?sslmode=require&password=hunter2"
            ),
            "bad password ***"
        );
        assert_eq!(
            password_in("no secret here", "postgres://a@h/db"),
            "no secret here"
        );
    }
}
