//! Authorization tokens from the console, over plain HTTP (the page's forms work without
//! the script): a person signed in issues a token (its secret shown once), sees it listed,
//! and revokes it; a form posted from another site changes nothing.

use super::{TOKEN, Troupe};
use std::process::Command;
use troupe_test_support::ModelServer;

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl runs");
    assert!(out.status.success(), "curl {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn tokens(base: &str) -> serde_json::Value {
    let text = curl(&[
        "-H",
        &format!("Authorization: Bearer {TOKEN}"),
        &format!("{base}/api/tokens"),
    ]);
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_issues_and_revokes_a_token_from_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelServer::start().await;
    let mut troupe = Troupe::start(dir.path(), &model);
    let base = troupe.base.clone();

    // Without credentials: the sign-in form, coming back to the tokens page.
    let anonymous = curl(&[&format!("{base}/tokens")]);
    assert!(
        anonymous.contains(r#"action="/console/sign-in""#),
        "{anonymous}"
    );
    assert!(anonymous.contains(r#"value="/tokens""#), "{anonymous}");

    // A form sign-in: the cookie.
    let headers = curl(&[
        "-D",
        "-",
        "-o",
        "/dev/null",
        "--data-urlencode",
        &format!("token={TOKEN}"),
        "--data-urlencode",
        "next=/tokens",
        &format!("{base}/console/sign-in"),
    ]);
    let cookie = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap()
        .split_once(':')
        .unwrap()
        .1
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_owned();
    let origin = format!("Origin: {base}");
    let page = curl(&["-b", &cookie, &format!("{base}/tokens")]);
    assert!(page.contains(r#"id="issue-form""#), "{page}");
    assert!(page.contains(r#"id="no-tokens""#), "{page}");
    assert!(page.contains(r#"<a href="/tokens">Tokens</a>"#), "{page}");

    // Issue: 303 to the tokens page, which shows the secret once; reloading it shows no
    // secret and issues nothing more.
    let form = [
        "--data-urlencode",
        "agent=*",
        "--data-urlencode",
        "tool=shell",
        "--data-urlencode",
        "args=echo *",
        "--data-urlencode",
        "ttl_secs=600",
        "--data-urlencode",
        "max_uses=2",
    ];
    let answer = curl(
        &[
            &["-D", "-", "-o", "/dev/null", "-b", &cookie, "-H", &origin][..],
            &form[..],
            &[format!("{base}/console/tokens").as_str()][..],
        ]
        .concat(),
    );
    assert!(answer.starts_with("HTTP/1.1 303"), "{answer}");
    let location = answer
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("location:"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no location in {answer}"));
    assert!(location.starts_with("/tokens?issued="), "{location}");
    let issued = curl(&["-b", &cookie, &format!("{base}{location}")]);
    let secret = issued
        .split(r#"<code id="issued-secret">"#)
        .nth(1)
        .and_then(|rest| rest.split("</code>").next())
        .unwrap_or_else(|| panic!("no secret on {issued}"))
        .to_owned();
    let reloaded = curl(&["-b", &cookie, &format!("{base}{location}")]);
    assert!(
        !reloaded.contains("issued-secret") && !reloaded.contains(&secret),
        "{reloaded}"
    );
    assert_eq!(tokens(&base).as_array().unwrap().len(), 1, "one token only");
    assert!(secret.len() >= 16, "{secret}");
    let listing = tokens(&base);
    let list = listing.as_array().unwrap();
    assert_eq!(list.len(), 1, "{listing}");
    let id = list[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list[0]["tool"], "shell");
    assert_eq!(list[0]["agent"], "*");
    assert_eq!(list[0]["args"], "echo *");
    assert_eq!(list[0]["max_uses"], 2);
    assert_eq!(list[0]["issued_by"], "console");
    assert!(
        !listing.to_string().contains(&secret),
        "never listed in clear"
    );
    // The list page shows it in force, without its secret, with a revoke button.
    let page = curl(&["-b", &cookie, &format!("{base}/tokens")]);
    assert!(
        page.contains(&format!(r#"<tr data-token="{id}">"#)),
        "{page}"
    );
    assert!(
        page.contains("in force") && !page.contains(&secret),
        "{page}"
    );
    assert!(page.contains(&format!(r#"action="/console/tokens/{id}/revoke""#)));

    // A bad form: 400 with the reason, nothing issued.
    let bad = curl(&[
        "-w",
        "\n%{http_code}",
        "-b",
        &cookie,
        "-H",
        &origin,
        "--data-urlencode",
        "agent=*",
        "--data-urlencode",
        "tool=shell",
        "--data-urlencode",
        "ttl_secs=0",
        "--data-urlencode",
        "max_uses=1",
        &format!("{base}/console/tokens"),
    ]);
    assert!(bad.ends_with("\n400"), "{bad}");
    assert!(
        bad.contains("Valid for must be a whole number above 0"),
        "{bad}"
    );
    // Posted from another site's page: refused, nothing issued.
    let forged = curl(
        &[
            &["-o", "/dev/null", "-w", "%{http_code}", "-b", &cookie][..],
            &["-H", "Origin: http://evil.example"][..],
            &form[..],
            &[format!("{base}/console/tokens").as_str()][..],
        ]
        .concat(),
    );
    assert_eq!(forged, "403");
    // The cookie alone, without an Origin (a client that does not say where it posts from):
    // refused as every cookie write is.
    let unnamed = curl(
        &[
            &["-o", "/dev/null", "-w", "%{http_code}", "-b", &cookie][..],
            &form[..],
            &[format!("{base}/console/tokens").as_str()][..],
        ]
        .concat(),
    );
    assert_eq!(unnamed, "403");
    assert_eq!(tokens(&base).as_array().unwrap().len(), 1);
    for from in [None, Some("Origin: http://evil.example")] {
        let revoke = format!("{base}/console/tokens/{id}/revoke");
        let mut args = vec!["-o", "/dev/null", "-w", "%{http_code}", "-b", &cookie];
        if let Some(from) = from {
            args.extend(["-H", from]);
        }
        args.extend(["-X", "POST", &revoke]);
        assert_eq!(curl(&args), "403", "revoke from {from:?}");
        assert!(tokens(&base)[0]["revoked_ms"].is_null(), "still in force");
    }

    // Revoke: 303 back to the list, where it shows revoked and has no button any more.
    let revoked = curl(&[
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-b",
        &cookie,
        "-H",
        &origin,
        "-X",
        "POST",
        &format!("{base}/console/tokens/{id}/revoke"),
    ]);
    assert!(revoked.starts_with("HTTP/1.1 303"), "{revoked}");
    assert!(revoked.to_ascii_lowercase().contains("location: /tokens"));
    assert!(tokens(&base)[0]["revoked_ms"].is_u64());
    let page = curl(&["-b", &cookie, &format!("{base}/tokens")]);
    assert!(page.contains(r#"<td class="state">revoked</td>"#), "{page}");
    assert!(!page.contains(&format!(r#"action="/console/tokens/{id}/revoke""#)));
    troupe.stop();
}
