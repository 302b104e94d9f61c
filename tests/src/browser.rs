//! A blocking driver of headless Chromium over the Chrome DevTools Protocol, for tests that
//! look at a web page: open a URL, evaluate JavaScript, click, wait, take a screenshot.
//!
//! Chromium runs with `--remote-debugging-pipe`: it reads protocol messages from its file
//! descriptor 3 and writes its own to descriptor 4, each message one JSON object terminated by
//! a NUL byte. A command is `{"id", "method", "params"}` and is answered by the message with
//! the same `id`, carrying either `result` or `error`; everything else Chromium writes is an
//! event (`{"method", "params"}`). Commands for a page go to the browser's single connection
//! with the `sessionId` of a flat attachment to the page's target (`Target.attachToTarget`
//! with `flatten: true`), and the page's events come back tagged with that `sessionId`.
//!
//! The crate forbids `unsafe`, so the descriptors are not arranged with `pre_exec`: Chromium is
//! started through `/bin/sh`, which receives the two pipes as its stdin and stdout, moves them
//! to descriptors 3 and 4, points stdin at `/dev/null` and stdout at the stderr log, and
//! `exec`s Chromium. The parent's ends of both pipes are close-on-exec, so neither the shell
//! nor Chromium (nor any other process the tests start) holds them.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

/// How long a command may go unanswered, and how long [`Browser::goto`] waits for the load.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`Browser::wait_for`] evaluates its expression.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// How long [`Drop`] lets Chromium close before killing it.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How many lines of Chromium's stderr an error quotes.
const STDERR_LINES: usize = 20;
/// How many unclaimed events are kept (the oldest are dropped beyond this).
const MAX_EVENTS: usize = 1000;

/// The script that gives Chromium its protocol pipes on descriptors 3 and 4 (see the module
/// documentation); `$0` is Chromium, `$@` its arguments.
const FD_SHUFFLE: &str = r#"exec 3<&0 4>&1 </dev/null >&2 && exec "$0" "$@""#;

/// A headless Chromium with one page attached, driven over the DevTools pipe. Dropping it
/// closes the browser and removes its profile directory.
pub struct Browser {
    child: Child,
    /// Chromium's descriptor 3.
    to_browser: ChildStdin,
    /// What the reader thread parsed from Chromium's descriptor 4: a message, or why one
    /// could not be read.
    from_browser: Receiver<Result<Value, String>>,
    /// Events that arrived while waiting for something else, oldest first.
    events: VecDeque<Value>,
    /// The last message that could not be parsed, quoted when a wait fails.
    malformed: Option<String>,
    next_id: u64,
    /// The flat session attached to the page.
    session: String,
    stderr_log: PathBuf,
    /// The profile (`--user-data-dir`) and the stderr log; removed after Chromium exits.
    _dir: tempfile::TempDir,
}

impl Browser {
    /// Finds chromium: `$ZERG_CHROMIUM`, else `chromium`, else `chromium-browser` on `PATH`,
    /// starts it headless with a fresh profile and attaches to its page. The error names what
    /// was tried when no Chromium is found, and quotes Chromium's stderr when it does not
    /// start or answer.
    pub fn launch() -> Result<Browser, String> {
        let chromium = find_chromium()?;
        let dir = tempfile::Builder::new()
            .prefix("zerg-chromium-")
            .tempdir()
            .map_err(|e| format!("creating Chromium's profile directory: {e}"))?;
        let stderr_log = dir.path().join("chromium-stderr.log");
        let stderr = File::create(&stderr_log)
            .map_err(|e| format!("creating {}: {e}", stderr_log.display()))?;
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(FD_SHUFFLE)
            .arg(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", dir.path().display()))
            .args(["--window-size=1280,900", "about:blank"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", chromium.display()))?;
        let (Some(to_browser), Some(out)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("starting Chromium: its pipes were not set up".to_owned());
        };
        let (tx, from_browser) = mpsc::channel();
        if let Err(e) = std::thread::Builder::new()
            .name("chromium-pipe".to_owned())
            .spawn(move || read_messages(out, tx))
        {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("starting the thread reading Chromium's pipe: {e}"));
        }
        let mut browser = Browser {
            child,
            to_browser,
            from_browser,
            events: VecDeque::new(),
            malformed: None,
            next_id: 0,
            session: String::new(),
            stderr_log,
            _dir: dir,
        };
        browser
            .attach()
            .map_err(|e| format!("{} did not come up: {e}", chromium.display()))?;
        Ok(browser)
    }

    /// Opens `url` in the page and waits (up to 30 s) for its load event. A navigation
    /// Chromium refuses (an unknown host, a refused connection) is an error.
    pub fn goto(&mut self, url: &str) -> Result<(), String> {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        // A load event left from an earlier navigation must not end this one's wait.
        let session = self.session.clone();
        self.events
            .retain(|e| !is_event(e, "Page.loadEventFired", &session));
        let nav = self.page_command("Page.navigate", json!({ "url": url }), deadline)?;
        if let Some(err) = nav.get("errorText").and_then(Value::as_str) {
            return Err(format!("opening {url}: {err}"));
        }
        // Without a loader the navigation stayed within the document (a fragment): no load.
        if nav.get("loaderId").is_none() {
            return Ok(());
        }
        self.wait_event("Page.loadEventFired", deadline)
            .map_err(|e| format!("opening {url}: {e}"))?;
        Ok(())
    }

    /// Evaluates a JavaScript expression in the page (awaiting a promise it returns) and
    /// returns its value as JSON: `undefined` is `null`, and the numbers JSON cannot carry
    /// (`NaN`, `Infinity`, `-0`, BigInts) come back as their JavaScript spelling in a string.
    /// A thrown exception is an error carrying its description.
    pub fn eval(&mut self, js: &str) -> Result<Value, String> {
        match self.evaluate(js)? {
            Ok(object) => Ok(remote_value(&object)),
            Err(thrown) => Err(format!("`{js}` threw: {thrown}")),
        }
    }

    /// Evaluates `js` every 100 ms until it returns something truthy (not `false`, `null`,
    /// `0`, `""`, `NaN` or `undefined`) and returns that value. An exception counts as "not
    /// yet" (the element the expression reads may not exist yet). After `timeout` the error
    /// names the expression and its last value or exception.
    pub fn wait_for(&mut self, js: &str, timeout: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.evaluate(js)? {
                Ok(object) if truthy(&object) => return Ok(remote_value(&object)),
                Ok(object) => format!("last value: {}", remote_value(&object)),
                Err(thrown) => format!("last exception: {thrown}"),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "`{js}` was still not truthy after {timeout:?} ({last})"
                ));
            }
            std::thread::sleep(POLL_EVERY.min(deadline - now));
        }
    }

    /// Clicks the first element matching a CSS selector: scrolls it into view and calls its
    /// `click()`. An error when nothing matches or the selector is invalid.
    pub fn click(&mut self, selector: &str) -> Result<(), String> {
        // A JSON string is a JavaScript string literal.
        let quoted = Value::String(selector.to_owned()).to_string();
        let js = format!(
            "(() => {{ const el = document.querySelector({quoted}); if (!el) return false; \
             el.scrollIntoView({{ block: 'center', inline: 'center' }}); el.click(); \
             return true; }})()"
        );
        match self.evaluate(&js)? {
            Ok(clicked) if remote_value(&clicked) == Value::Bool(true) => Ok(()),
            Ok(_) => Err(format!("clicking {selector:?}: no element matches it")),
            Err(thrown) => Err(format!("clicking {selector:?}: {thrown}")),
        }
    }

    /// Saves a PNG screenshot of the page's viewport (`Page.captureScreenshot`) to `path`,
    /// creating its parent directories.
    pub fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        let shot = self.page_command(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": false }),
            Instant::now() + COMMAND_TIMEOUT,
        )?;
        let Some(data) = shot.get("data").and_then(Value::as_str) else {
            return Err("Page.captureScreenshot returned no data".to_owned());
        };
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| format!("decoding the screenshot: {e}"))?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(path, png).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Attaches a flat session to the browser's page (creating one if there is none) and
    /// enables the page and runtime domains on it.
    fn attach(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let targets = self.command("Target.getTargets", json!({}), None, deadline)?;
        let page = targets
            .get("targetInfos")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|t| t.get("type").and_then(Value::as_str) == Some("page"))
            .and_then(|t| t.get("targetId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let target = match page {
            Some(id) => id,
            None => {
                let created = self.command(
                    "Target.createTarget",
                    json!({ "url": "about:blank" }),
                    None,
                    deadline,
                )?;
                created
                    .get("targetId")
                    .and_then(Value::as_str)
                    .ok_or("Target.createTarget returned no targetId")?
                    .to_owned()
            }
        };
        let attached = self.command(
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
            None,
            deadline,
        )?;
        self.session = attached
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or("Target.attachToTarget returned no sessionId")?
            .to_owned();
        self.page_command("Page.enable", json!({}), deadline)?;
        self.page_command("Runtime.enable", json!({}), deadline)?;
        Ok(())
    }

    /// `Runtime.evaluate`: the resulting remote object, or the description of what the
    /// expression threw. The outer error is the protocol's.
    fn evaluate(&mut self, js: &str) -> Result<Result<Value, String>, String> {
        let mut reply = self.page_command(
            "Runtime.evaluate",
            json!({ "expression": js, "awaitPromise": true, "returnByValue": true }),
            Instant::now() + COMMAND_TIMEOUT,
        )?;
        if let Some(details) = reply.get("exceptionDetails") {
            return Ok(Err(exception_text(details)));
        }
        Ok(Ok(reply
            .get_mut("result")
            .map(Value::take)
            .unwrap_or(Value::Null)))
    }

    /// A command to the attached page.
    fn page_command(
        &mut self,
        method: &str,
        params: Value,
        deadline: Instant,
    ) -> Result<Value, String> {
        let session = self.session.clone();
        self.command(method, params, Some(&session), deadline)
    }

    /// Sends one command (to the browser, or to a session) and waits until `deadline` for
    /// its answer: its `result`, or its `error` as an error. Events that arrive meanwhile are
    /// kept for [`Browser::wait_event`].
    fn command(
        &mut self,
        method: &str,
        params: Value,
        session: Option<&str>,
        deadline: Instant,
    ) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = Value::from(session);
        }
        self.send(&message)
            .map_err(|e| format!("sending {method}: {e}{}", self.stderr_tail()))?;
        loop {
            let mut reply = self.next_message(deadline, method)?;
            if reply.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(error) = reply.get("error") {
                    let text = error
                        .get("message")
                        .and_then(Value::as_str)
                        .map_or_else(|| error.to_string(), str::to_owned);
                    return Err(match error.get("data").and_then(Value::as_str) {
                        Some(data) => format!("{method} failed: {text} ({data})"),
                        None => format!("{method} failed: {text}"),
                    });
                }
                return Ok(reply
                    .get_mut("result")
                    .map(Value::take)
                    .unwrap_or(Value::Null));
            }
            // Answers to commands that timed out earlier are dropped; events are kept.
            if reply.get("id").is_none() {
                self.keep_event(reply);
            }
        }
    }

    /// Waits until `deadline` for the event `method` from the attached page, taking it from
    /// the kept events first. An error if the page crashes or is detached meanwhile.
    fn wait_event(&mut self, method: &str, deadline: Instant) -> Result<Value, String> {
        if let Some(i) = self
            .events
            .iter()
            .position(|e| is_event(e, method, &self.session))
        {
            return Ok(self.events.remove(i).unwrap_or(Value::Null));
        }
        loop {
            let message = self.next_message(deadline, method)?;
            if is_event(&message, method, &self.session) {
                return Ok(message);
            }
            if is_event(&message, "Inspector.targetCrashed", &self.session) {
                return Err(format!(
                    "the page crashed while waiting for {method}{}",
                    self.stderr_tail()
                ));
            }
            if message.get("method").and_then(Value::as_str) == Some("Target.detachedFromTarget")
                && message.pointer("/params/sessionId").and_then(Value::as_str)
                    == Some(self.session.as_str())
            {
                return Err(format!("the page went away while waiting for {method}"));
            }
            if message.get("id").is_none() {
                self.keep_event(message);
            }
        }
    }

    /// The next message from Chromium, or an error when none arrives by `deadline` or the
    /// pipe closes; `what` names what was awaited.
    fn next_message(&mut self, deadline: Instant, what: &str) -> Result<Value, String> {
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.from_browser.recv_timeout(wait) {
                Ok(Ok(message)) => return Ok(message),
                Ok(Err(bad)) => self.malformed = Some(bad),
                Err(RecvTimeoutError::Timeout) => {
                    let malformed = match &self.malformed {
                        Some(bad) => format!(" (the last message that could not be read: {bad})"),
                        None => String::new(),
                    };
                    return Err(format!(
                        "Chromium did not answer {what} in time{malformed}{}",
                        self.stderr_tail()
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Chromium is likely exiting: give it a moment, to report how it did.
                    let mut status = String::new();
                    for _ in 0..25 {
                        match self.child.try_wait() {
                            Ok(Some(exit)) => status = format!(" ({exit})"),
                            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                            Err(_) => {}
                        }
                        if !status.is_empty() {
                            break;
                        }
                    }
                    return Err(format!(
                        "Chromium closed its pipe while {what} was awaited{status}{}",
                        self.stderr_tail()
                    ));
                }
            }
        }
    }

    /// Keeps an event for a later [`Browser::wait_event`], dropping the oldest beyond
    /// [`MAX_EVENTS`].
    fn keep_event(&mut self, event: Value) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    /// Writes one NUL-terminated message to Chromium's descriptor 3.
    fn send(&mut self, message: &Value) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(message)?;
        bytes.push(0);
        self.to_browser.write_all(&bytes)?;
        self.to_browser.flush()
    }

    /// The last lines of Chromium's stderr, as a paragraph to append to an error.
    fn stderr_tail(&self) -> String {
        let text = match std::fs::read(&self.stderr_log) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => return format!("\n(Chromium's stderr could not be read: {e})"),
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.is_empty() {
            return "\n(Chromium wrote nothing to stderr)".to_owned();
        }
        let tail = &lines[lines.len().saturating_sub(STDERR_LINES)..];
        format!(
            "\nChromium's stderr (last {} lines):\n  {}",
            tail.len(),
            tail.join("\n  ")
        )
    }
}

impl Drop for Browser {
    /// Asks Chromium to close (`Browser.close`), kills it if it is still running 2 s later,
    /// and reaps it; then the profile directory is removed.
    fn drop(&mut self) {
        self.next_id += 1;
        let close = json!({ "id": self.next_id, "method": "Browser.close", "params": {} });
        if self.send(&close).is_ok() {
            let deadline = Instant::now() + CLOSE_GRACE;
            while Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(Some(_)) => return,
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    Err(_) => break,
                }
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Chromium to run: `$ZERG_CHROMIUM` if set (a path, or a name looked up on `PATH`),
/// else `chromium` or `chromium-browser` on `PATH`.
fn find_chromium() -> Result<PathBuf, String> {
    if let Some(chosen) = std::env::var_os("ZERG_CHROMIUM").filter(|v| !v.is_empty()) {
        let chosen = PathBuf::from(chosen);
        return resolve(&chosen).ok_or_else(|| {
            format!(
                "Chromium not found: $ZERG_CHROMIUM is {}, which is not an executable file{}",
                chosen.display(),
                if chosen.components().count() == 1 {
                    " on PATH"
                } else {
                    ""
                }
            )
        });
    }
    ["chromium", "chromium-browser"]
        .iter()
        .find_map(|name| resolve(Path::new(name)))
        .ok_or_else(|| {
            "Chromium not found: $ZERG_CHROMIUM is not set, and neither `chromium` nor \
             `chromium-browser` is an executable on PATH"
                .to_owned()
        })
}

/// `program` itself if it is a path (has a `/`), else the first executable of that name on
/// `PATH`; `None` if it is not an executable file.
fn resolve(program: &Path) -> Option<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 || program.is_absolute() {
        return executable(program).then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// The reader thread: splits Chromium's descriptor 4 on NUL bytes and sends each message,
/// parsed, until the pipe closes or nobody listens.
fn read_messages(out: ChildStdout, tx: Sender<Result<Value, String>>) {
    let mut out = BufReader::new(out);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match out.read_until(0, &mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                let _ = tx.send(Err(format!("reading Chromium's pipe: {e}")));
                return;
            }
        }
        if buf.last() == Some(&0) {
            buf.pop();
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let message = serde_json::from_slice::<Value>(&buf).map_err(|e| {
            let text = String::from_utf8_lossy(&buf);
            let head: String = text.chars().take(200).collect();
            format!("{e}: {head}")
        });
        if tx.send(message).is_err() {
            return;
        }
    }
}

/// Whether `message` is the event `method` from the session `session`.
fn is_event(message: &Value, method: &str, session: &str) -> bool {
    message.get("method").and_then(Value::as_str) == Some(method)
        && message.get("sessionId").and_then(Value::as_str) == Some(session)
}

/// The JSON value of a remote object evaluated with `returnByValue`.
fn remote_value(object: &Value) -> Value {
    if let Some(spelling) = object.get("unserializableValue").and_then(Value::as_str) {
        return Value::from(spelling);
    }
    object.get("value").cloned().unwrap_or(Value::Null)
}

/// JavaScript's truthiness of a remote object evaluated with `returnByValue`.
fn truthy(object: &Value) -> bool {
    if let Some(spelling) = object.get("unserializableValue").and_then(Value::as_str) {
        return !matches!(spelling, "NaN" | "-0" | "0n" | "-0n");
    }
    match object.get("value") {
        None => object.get("type").and_then(Value::as_str) != Some("undefined"),
        Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(_) | Value::Object(_)) => true,
    }
}

/// What an evaluation threw, from `Runtime.evaluate`'s `exceptionDetails`: the error's
/// description (message and stack), else the thrown value, else the summary text.
fn exception_text(details: &Value) -> String {
    let exception = details.get("exception");
    if let Some(description) = exception
        .and_then(|e| e.get("description"))
        .and_then(Value::as_str)
    {
        return description.to_owned();
    }
    if let Some(value) = exception.and_then(|e| e.get("value")) {
        return value.to_string();
    }
    details
        .get("text")
        .and_then(Value::as_str)
        .map_or_else(|| details.to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "<title>zerg browser test</title>\
        <div id=out>before</div>\
        <button id=go onclick=\"document.getElementById('out').textContent='after'\">Go</button>";

    #[test]
    fn drives_a_page() {
        if let Err(why) = find_chromium() {
            crate::skip(&why);
            return;
        }
        let mut browser = Browser::launch().unwrap_or_else(|e| panic!("{e}"));
        let url = format!("data:text/html,{}", percent_encode(PAGE));
        browser.goto(&url).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            browser.eval("document.title").unwrap(),
            Value::from("zerg browser test")
        );
        assert_eq!(
            browser.eval("Promise.resolve(6 * 7)").unwrap(),
            Value::from(42)
        );
        let thrown = browser.eval("(() => { throw new Error('boom') })()");
        assert!(
            thrown.as_ref().is_err_and(|e| e.contains("boom")),
            "{thrown:?}"
        );
        let missing = browser.click("#nothing-here");
        assert!(missing.is_err(), "{missing:?}");

        browser.click("#go").unwrap_or_else(|e| panic!("{e}"));
        let text = browser
            .wait_for(
                "document.getElementById('out').textContent === 'after' && \
                 document.getElementById('out').textContent",
                Duration::from_secs(10),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(text, Value::from("after"));
        let late = browser.wait_for("window.neverSet", Duration::from_millis(300));
        assert!(
            late.as_ref().is_err_and(|e| e.contains("window.neverSet")),
            "{late:?}"
        );

        let dir = tempfile::tempdir().unwrap();
        let shot = dir.path().join("shots").join("page.png");
        browser.screenshot(&shot).unwrap_or_else(|e| panic!("{e}"));
        let png = std::fs::read(&shot).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n"),
            "not a PNG: {:?}",
            &png[..png.len().min(16)]
        );
    }

    /// Percent-encodes everything but unreserved characters, for a `data:` URL.
    fn percent_encode(s: &str) -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }
}
