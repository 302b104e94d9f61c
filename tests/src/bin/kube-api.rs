//! `kube-api`: a stand-in for a Kubernetes API server with one node, for running zergd's
//! kubernetes mode end to end (a kubeconfig whose cluster is `server: http://127.0.0.1:PORT`).
//!
//! It listens on 127.0.0.1 (an ephemeral port), prints `listening 127.0.0.1:PORT` once it
//! accepts connections, and serves, in any namespace, what zergd's kubernetes launcher uses:
//! create, get, list (by equality label selectors), delete of Jobs (`batch/v1`), Pods,
//! Secrets and ConfigMaps; a merge patch of a Job; and watches of Pods (chunked JSON lines
//! from a resource version). A create of a name that exists is answered 409 AlreadyExists.
//!
//! When a Job is started (created, or patched, with `spec.suspend` false) it "runs" the Job's
//! one pod: a container of the pod's image started with `docker run` on the host network,
//! as the pod's user and group (and `fsGroup`), every capability dropped, no new privileges,
//! with the pod's environment and command, its Secret and ConfigMap volumes written to files
//! (mode `defaultMode`, group `fsGroup`) and bound read-only at their mount paths, and its
//! `emptyDir` volumes as anonymous volumes. The pod is labelled as the Job controller labels
//! it (`batch.kubernetes.io/controller-uid`, `batch.kubernetes.io/job-name` and the
//! template's labels); its status follows the container (Pending, Running, then terminated
//! with the exit code, `OOMKilled` when so), and the Job gets a `Complete` or `Failed`
//! condition. Deleting a Job removes its pods' containers and the Secrets and ConfigMaps it
//! owns.
//!
//! `--record DIR` writes every object created, as received, to `DIR/objects/NNNN-<kind>.json`
//! (except those a test plants, with the query parameter `unrecorded`),
//! and one line per request (`METHOD PATH?QUERY STATUS`) to `DIR/requests.log`. Containers
//! carry the label `zerg.kube-api=<port>`.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use zerg_proto::testkit::{docker_cli as docker, effective_security};

/// The kinds served, by the collection name in the path.
const KINDS: &[(&str, &str, &str)] = &[
    ("jobs", "Job", "batch/v1"),
    ("pods", "Pod", "v1"),
    ("secrets", "Secret", "v1"),
    ("configmaps", "ConfigMap", "v1"),
];

/// Objects by (collection, namespace, name).
type Key = (String, String, String);

#[derive(Default)]
struct State {
    version: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change of a pod, in order: (resource version, event type, the pod then).
    pod_events: Vec<(u64, &'static str, Value)>,
    /// Objects recorded so far.
    recorded: usize,
}

struct Server {
    state: Mutex<State>,
    changed: Condvar,
    record: Option<PathBuf>,
    port: u16,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let record = match args.as_slice() {
        [] => None,
        [flag, dir] if flag == "--record" => Some(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: kube-api [--record DIR]");
            return ExitCode::from(2);
        }
    };
    if let Some(dir) = &record {
        std::fs::create_dir_all(dir.join("objects")).expect("record dir");
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = Arc::new(Server {
        state: Mutex::default(),
        changed: Condvar::new(),
        record,
        port,
    });
    let monitor = server.clone();
    std::thread::spawn(move || monitor.follow_containers());
    println!("listening 127.0.0.1:{port}");
    let _ = std::io::stdout().flush();
    for stream in listener.incoming().flatten() {
        let server = server.clone();
        std::thread::spawn(move || {
            if let Err(e) = server.serve(stream) {
                eprintln!("kube-api: {e}");
            }
        });
    }
    ExitCode::SUCCESS
}

/// One HTTP request.
struct Request {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    body: Vec<u8>,
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The next request on the connection, its query split into decoded pairs.
fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let Some(raw) = zerg_tests::http1::read_request(r)? else {
        return Ok(None);
    };
    let (path, query) = raw.target.split_once('?').unwrap_or((&raw.target, ""));
    let query = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect();
    Ok(Some(Request {
        path: path.to_string(),
        query,
        method: raw.method,
        body: raw.body,
    }))
}

fn respond(w: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reason(status),
        text.len()
    );
    w.write_all(head.as_bytes())?;
    w.write_all(text.as_bytes())?;
    w.flush()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        404 => "Not Found",
        409 => "Conflict",
        _ => "Bad Request",
    }
}

fn status(code: u16, reason: &str, message: String) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
           "status": if code < 300 { "Success" } else { "Failure" },
           "reason": reason, "code": code, "message": message})
}

/// Whether `labels` match an equality selector `a=b,c=d` (`a==b` too).
fn matches(selector: Option<&String>, labels: &Value) -> bool {
    selector.is_none_or(|s| {
        s.split(',').filter(|t| !t.is_empty()).all(|term| {
            let (k, v) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .unwrap_or((term, ""));
            labels[k.trim()] == v.trim()
        })
    })
}

/// The parts of an API path: (collection, namespace, name).
fn route(path: &str) -> Option<(String, String, Option<String>)> {
    let rest = path
        .strip_prefix("/apis/batch/v1/namespaces/")
        .or_else(|| path.strip_prefix("/api/v1/namespaces/"))?;
    let mut parts = rest.split('/');
    let ns = parts.next()?.to_string();
    let collection = parts.next()?.to_string();
    KINDS.iter().find(|(c, _, _)| *c == collection)?;
    let name = parts.next().map(str::to_string);
    parts.next().is_none().then_some((collection, ns, name))
}

fn now_rfc3339() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if out.is_empty() {
        "2026-01-01T00:00:00Z".into()
    } else {
        out
    }
}

impl Server {
    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        let mut w = stream.try_clone()?;
        let mut r = BufReader::new(stream);
        let Some(req) = read_request(&mut r)? else {
            return Ok(());
        };
        let query: String = req
            .query
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let Some((collection, ns, name)) = route(&req.path) else {
            self.log(&format!("{} {}?{query} 404", req.method, req.path));
            return respond(
                &mut w,
                404,
                &status(404, "NotFound", format!("no route {}", req.path)),
            );
        };
        if req.method == "GET"
            && name.is_none()
            && req
                .query
                .get("watch")
                .is_some_and(|v| v == "true" || v == "1")
        {
            self.log(&format!("WATCH {}?{query} 200", req.path));
            return self.watch(&mut w, &ns, &req.query);
        }
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let (code, answer) = self.handle(&req.method, &collection, &ns, name, body, &req.query);
        self.log(&format!("{} {}?{query} {code}", req.method, req.path));
        respond(&mut w, code, &answer)
    }

    fn log(&self, line: &str) {
        eprintln!("kube-api: {line}");
        if let Some(dir) = &self.record {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("requests.log"))
                .expect("requests.log");
            let _ = writeln!(f, "{line}");
        }
    }

    fn handle(
        &self,
        method: &str,
        collection: &str,
        ns: &str,
        name: Option<String>,
        body: Value,
        query: &BTreeMap<String, String>,
    ) -> (u16, Value) {
        let (_, kind, api_version) = *KINDS.iter().find(|(c, _, _)| *c == collection).unwrap();
        let mut st = self.state.lock().unwrap();
        let key = |n: &str| (collection.to_string(), ns.to_string(), n.to_string());
        match (method, name) {
            ("POST", None) => {
                let recorded = !query.contains_key("unrecorded");
                if let Some(dir) = self.record.as_ref().filter(|_| recorded) {
                    st.recorded += 1;
                    let file = dir
                        .join("objects")
                        .join(format!("{:04}-{kind}.json", st.recorded));
                    std::fs::write(file, body.to_string()).expect("record");
                }
                let Some(n) = body["metadata"]["name"].as_str().map(str::to_string) else {
                    return (400, status(400, "BadRequest", "no name".into()));
                };
                if st.objects.contains_key(&key(&n)) {
                    return (
                        409,
                        status(
                            409,
                            "AlreadyExists",
                            format!("{collection} \"{n}\" already exists"),
                        ),
                    );
                }
                st.version += 1;
                let mut obj = body;
                obj["metadata"]["uid"] = json!(format!("uid-{}-{}", st.version, n));
                obj["metadata"]["namespace"] = json!(ns);
                obj["metadata"]["resourceVersion"] = json!(st.version.to_string());
                obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
                st.objects.insert(key(&n), obj.clone());
                if kind == "Job" && obj["spec"]["suspend"] != true {
                    self.start_pod(&mut st, ns, &n);
                }
                (201, obj)
            }
            ("GET", Some(n)) => match st.objects.get(&key(&n)) {
                Some(obj) => (200, obj.clone()),
                None => (
                    404,
                    status(404, "NotFound", format!("{collection} \"{n}\" not found")),
                ),
            },
            ("GET", None) => {
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|((c, s, _), o)| {
                        c == collection
                            && s == ns
                            && matches(query.get("labelSelector"), &o["metadata"]["labels"])
                    })
                    .map(|(_, o)| o.clone())
                    .collect();
                (
                    200,
                    json!({"apiVersion": api_version, "kind": format!("{kind}List"),
                           "metadata": {"resourceVersion": st.version.to_string()},
                           "items": items}),
                )
            }
            ("PATCH", Some(n)) if kind == "Job" => {
                let Some(job) = st.objects.get_mut(&key(&n)) else {
                    return (
                        404,
                        status(404, "NotFound", format!("jobs \"{n}\" not found")),
                    );
                };
                merge(job, &body);
                let job = job.clone();
                if job["spec"]["suspend"] != true {
                    self.start_pod(&mut st, ns, &n);
                }
                (200, job)
            }
            ("DELETE", Some(n)) => {
                let Some(obj) = st.objects.remove(&key(&n)) else {
                    return (
                        404,
                        status(404, "NotFound", format!("{collection} \"{n}\" not found")),
                    );
                };
                match kind {
                    "Pod" => self.remove_pod(&mut st, obj.clone()),
                    "Job" => {
                        let uid = obj["metadata"]["uid"].clone();
                        let owned: Vec<Key> = st
                            .objects
                            .iter()
                            .filter(|((_, s, _), o)| {
                                s == ns
                                    && (o["metadata"]["labels"]
                                        ["batch.kubernetes.io/controller-uid"]
                                        == uid
                                        || o["metadata"]["ownerReferences"]
                                            .as_array()
                                            .is_some_and(|r| r.iter().any(|r| r["uid"] == uid)))
                            })
                            .map(|(k, _)| k.clone())
                            .collect();
                        for k in owned {
                            if let Some(o) = st.objects.remove(&k)
                                && k.0 == "pods"
                            {
                                self.remove_pod(&mut st, o);
                            }
                        }
                    }
                    _ => {}
                }
                self.changed.notify_all();
                (200, obj)
            }
            _ => (
                405,
                status(405, "MethodNotAllowed", format!("{method} {collection}")),
            ),
        }
    }

    /// Sends the pod events after the watch's resource version that match its selector, as
    /// they happen, until its `timeoutSeconds` (at most 60 s) pass or the client goes.
    fn watch(
        &self,
        w: &mut TcpStream,
        ns: &str,
        query: &BTreeMap<String, String>,
    ) -> std::io::Result<()> {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
        w.write_all(head.as_bytes())?;
        w.flush()?;
        let mut since: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(60u64)
            .min(60);
        let end = Instant::now() + Duration::from_secs(timeout);
        let selector = query.get("labelSelector");
        let mut st = self.state.lock().unwrap();
        while Instant::now() < end {
            let lines: Vec<String> = st
                .pod_events
                .iter()
                .filter(|(v, _, pod)| {
                    *v > since
                        && pod["metadata"]["namespace"] == ns
                        && matches(selector, &pod["metadata"]["labels"])
                })
                .map(|(_, kind, pod)| format!("{}\n", json!({"type": kind, "object": pod})))
                .collect();
            since = st.version;
            drop(st);
            for line in lines {
                write!(w, "{:x}\r\n{line}\r\n", line.len())?;
            }
            w.flush()?;
            st = self.state.lock().unwrap();
            st = self
                .changed
                .wait_timeout(st, Duration::from_millis(500))
                .unwrap()
                .0;
        }
        drop(st);
        w.write_all(b"0\r\n\r\n")?;
        w.flush()
    }

    /// Records a change of a pod (stored under its key unless it was deleted).
    fn pod_changed(&self, st: &mut State, mut pod: Value, kind: &'static str) {
        st.version += 1;
        pod["metadata"]["resourceVersion"] = json!(st.version.to_string());
        let key = (
            "pods".to_string(),
            pod["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            pod["metadata"]["name"].as_str().unwrap_or("").to_string(),
        );
        if kind != "DELETED" {
            st.objects.insert(key, pod.clone());
        }
        let v = st.version;
        st.pod_events.push((v, kind, pod));
        self.changed.notify_all();
    }

    fn remove_pod(&self, st: &mut State, pod: Value) {
        if let Some(name) = pod["metadata"]["name"].as_str() {
            let _ = docker(&["rm", "-f", "-v", name]);
        }
        self.pod_changed(st, pod, "DELETED");
    }

    /// Starts the one pod of Job `name`, unless it has one.
    fn start_pod(&self, st: &mut State, ns: &str, name: &str) {
        let job = st.objects[&("jobs".to_string(), ns.to_string(), name.to_string())].clone();
        let uid = job["metadata"]["uid"].clone();
        let has_pod = st.objects.iter().any(|((c, _, _), o)| {
            c == "pods" && o["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
        });
        if has_pod {
            return;
        }
        let pod_name = format!("{name}-{}", st.version);
        let mut labels = job["spec"]["template"]["metadata"]["labels"].clone();
        if !labels.is_object() {
            labels = json!({});
        }
        labels["batch.kubernetes.io/controller-uid"] = uid.clone();
        labels["batch.kubernetes.io/job-name"] = json!(name);
        let spec = job["spec"]["template"]["spec"].clone();
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                         "uid": format!("uid-pod-{pod_name}"),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": name, "uid": uid, "controller": true}]},
            "spec": spec,
            "status": {"phase": "Pending"},
        });
        let waiting = match self.run(st, ns, &pod_name, &spec) {
            Ok(()) => None,
            Err((reason, message)) => Some((reason, message)),
        };
        if let Some((reason, message)) = waiting {
            pod["status"] = json!({"phase": "Pending", "containerStatuses": [{
                "name": spec["containers"][0]["name"], "image": spec["containers"][0]["image"],
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}}}]});
        }
        self.pod_changed(st, pod, "ADDED");
    }

    /// `docker run` of the pod's one container.
    fn run(
        &self,
        st: &State,
        ns: &str,
        pod_name: &str,
        spec: &Value,
    ) -> Result<(), (&'static str, String)> {
        let c = &spec["containers"][0];
        let sc = &c["securityContext"];
        let psc = &spec["securityContext"];
        let pick = |k: &str| effective_security(spec, c, k);
        let uid = pick("runAsUser").as_i64().unwrap_or(0);
        let gid = pick("runAsGroup").as_i64().unwrap_or(uid);
        let fs_group = psc["fsGroup"].as_i64();
        let label = format!("zerg.kube-api={}", self.port);
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            pod_name,
            "--label",
            &label,
            "--network",
            "host",
            "--security-opt",
            "no-new-privileges",
            "--user",
            &format!("{uid}:{gid}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(g) = fs_group {
            args.extend(["--group-add".into(), g.to_string()]);
        }
        if sc["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL"))
        {
            args.extend(["--cap-drop".into(), "ALL".into()]);
        }
        for e in c["env"].as_array().into_iter().flatten() {
            args.extend([
                "-e".into(),
                format!(
                    "{}={}",
                    e["name"].as_str().unwrap_or(""),
                    e["value"].as_str().unwrap_or("")
                ),
            ]);
        }
        let files = self
            .record
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .join("volumes")
            .join(pod_name);
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let vname = m["name"].as_str().unwrap_or("");
            let path = m["mountPath"].as_str().unwrap_or("");
            let Some(v) = spec["volumes"]
                .as_array()
                .and_then(|vs| vs.iter().find(|v| v["name"] == vname))
            else {
                return Err(("CreateContainerConfigError", format!("no volume {vname}")));
            };
            let source = if !v["secret"].is_null() {
                Some((
                    "secrets",
                    v["secret"]["secretName"].as_str().unwrap_or(""),
                    &v["secret"]["defaultMode"],
                ))
            } else if !v["configMap"].is_null() {
                Some((
                    "configmaps",
                    v["configMap"]["name"].as_str().unwrap_or(""),
                    &v["configMap"]["defaultMode"],
                ))
            } else if !v["emptyDir"].is_null() {
                None
            } else {
                return Err((
                    "CreateContainerConfigError",
                    format!("volume {vname}: unsupported type"),
                ));
            };
            let Some((collection, object, mode)) = source else {
                args.extend(["-v".into(), path.to_string()]);
                continue;
            };
            let key = (collection.to_string(), ns.to_string(), object.to_string());
            let Some(obj) = st.objects.get(&key) else {
                return Err((
                    "CreateContainerConfigError",
                    format!("{collection} \"{object}\" not found"),
                ));
            };
            let dir = files.join(vname);
            std::fs::create_dir_all(&dir).expect("volume dir");
            // A Secret is kept as it was sent: its `stringData` (zergd sends no `data`).
            let data = if collection == "secrets" {
                &obj["stringData"]
            } else {
                &obj["data"]
            };
            for (k, v) in data.as_object().into_iter().flatten() {
                let text = v.as_str().unwrap_or("");
                let file = dir.join(k);
                std::fs::write(&file, text).expect("volume file");
                use std::os::unix::fs::PermissionsExt;
                let mode = mode.as_u64().unwrap_or(0o644) as u32;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
                    .expect("mode");
                if let Some(g) = fs_group {
                    let _ = std::os::unix::fs::chown(&file, Some(0), Some(g as u32));
                }
            }
            args.extend(["-v".into(), format!("{}:{path}:ro", dir.display())]);
        }
        args.push(c["image"].as_str().unwrap_or("").to_string());
        for a in c["command"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(c["args"].as_array().into_iter().flatten())
        {
            args.push(a.as_str().unwrap_or("").to_string());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&argv)
            .map(|_| ())
            .map_err(|e| ("CreateContainerError", e))
    }

    /// Follows the pods' containers: Running once started, terminated once exited.
    fn follow_containers(&self) {
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let pods: Vec<Value> = {
                let st = self.state.lock().unwrap();
                st.objects
                    .iter()
                    .filter(|((c, _, _), p)| {
                        c == "pods"
                            && matches!(p["status"]["phase"].as_str(), Some("Pending" | "Running"))
                            && p["status"]["containerStatuses"][0]["state"]["waiting"].is_null()
                    })
                    .map(|(_, p)| p.clone())
                    .collect()
            };
            for pod in pods {
                let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
                let Ok(state) = docker(&[
                    "inspect",
                    "--format",
                    "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}",
                    &name,
                ]) else {
                    continue;
                };
                let words: Vec<&str> = state.split_whitespace().collect();
                let container = |state: Value| {
                    json!([{"name": pod["spec"]["containers"][0]["name"],
                            "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                            "ready": state.get("running").is_some(), "restartCount": 0,
                            "state": state}])
                };
                let status = match words.as_slice() {
                    ["running", ..] if pod["status"]["phase"] == "Pending" => json!({
                        "phase": "Running", "containerStatuses": container(json!({"running": {}}))}),
                    ["exited", code, oom, ..] => {
                        let code: i64 = code.parse().unwrap_or(1);
                        let reason = if *oom == "true" {
                            "OOMKilled"
                        } else if code == 0 {
                            "Completed"
                        } else {
                            "Error"
                        };
                        json!({"phase": if code == 0 { "Succeeded" } else { "Failed" },
                               "containerStatuses": container(json!({"terminated": {
                                   "exitCode": code, "reason": reason}}))})
                    }
                    _ => continue,
                };
                let mut st = self.state.lock().unwrap();
                let ns = pod["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                let key = ("pods".to_string(), ns.clone(), name.clone());
                // Deleted meanwhile: nothing to report.
                let Some(current) = st.objects.get(&key).cloned() else {
                    continue;
                };
                let done = status["phase"] != "Running";
                let mut updated = current;
                updated["status"] = status.clone();
                self.pod_changed(&mut st, updated, "MODIFIED");
                if done {
                    let job = pod["metadata"]["labels"]["batch.kubernetes.io/job-name"]
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    let condition = if status["phase"] == "Succeeded" {
                        "Complete"
                    } else {
                        "Failed"
                    };
                    st.version += 1;
                    let version = st.version.to_string();
                    if let Some(j) = st.objects.get_mut(&("jobs".to_string(), ns, job)) {
                        j["status"] =
                            json!({"conditions": [{"type": condition, "status": "True"}]});
                        j["metadata"]["resourceVersion"] = json!(version);
                    }
                }
            }
        }
    }
}

/// A JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in p {
                if v.is_null() {
                    target.as_object_mut().unwrap().remove(k);
                } else {
                    merge(&mut target[k], v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}
