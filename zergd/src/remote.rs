//! The TCP worker plane of remote workers (swarm and kubernetes modes): its TLS material and its
//! listener.
//!
//! Remote workers share no filesystem with zergd, so they cannot open the rush's Unix socket.
//! They dial `remote.advertise_url` instead, over TLS, and trust only the CA zergd gives them
//! (a Swarm config or a ConfigMap, never the image). zergd mints that CA itself the first time
//! (an ECDSA P-256 key, kept with the CA certificate in `<state home>/remote/`, mode 0600 in a
//! 0700 directory) and signs a server certificate for the plane's names at every start; or it
//! takes the operator's PEM files (`remote.tls_cert`, `remote.tls_key`, `remote.tls_ca`).
//!
//! One listener serves every remote rush: a call names its rush, and its token must belong to
//! that rush's worker slot and generation, exactly as on a Unix socket. HTTP/2 keepalive pings
//! keep a parked lease's connection open through idle timeouts between hosts.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::config::RemoteConfig;

/// The plane's certificate, its key, and the CA workers trust (all PEM).
#[derive(Clone)]
pub struct PlaneTls {
    /// The CA certificate workers trust.
    pub ca_pem: String,
    /// The server certificate (chain).
    pub cert_pem: String,
    /// The server certificate's key.
    pub key_pem: String,
}

impl std::fmt::Debug for PlaneTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlaneTls(<keys redacted>)")
    }
}

/// The CA's subject; a server certificate's issuer must match it.
fn ca_name() -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "zergd worker plane CA");
    dn
}

fn ca_params() -> Result<CertificateParams, String> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.distinguished_name = ca_name();
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(p)
}

/// The host part of a `host:port` address or an `https://host:port/` URL.
pub fn host_of(addr: &str) -> String {
    let rest = addr.split_once("://").map_or(addr, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    if let Some(v6) = hostport.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6).to_string();
    }
    hostport
        .rsplit_once(':')
        .map_or(hostport, |(h, _)| h)
        .to_string()
}

/// Writes `text` to `path` with mode 0600 (temp file, fsync, rename).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The TLS material of the plane: the operator's files when `cfg` names them, else zergd's own
/// CA (minted once under `dir`) and a server certificate for the plane's names, signed now.
pub fn tls_material(dir: &Path, cfg: &RemoteConfig) -> Result<PlaneTls, String> {
    let given = [&cfg.tls_cert, &cfg.tls_key, &cfg.tls_ca];
    if given.iter().any(|f| !f.is_empty()) {
        let read = |key: &str, f: &str| {
            if f.is_empty() {
                return Err(format!(
                    "remote.{key} is empty: remote.tls_cert, remote.tls_key and remote.tls_ca go together"
                ));
            }
            std::fs::read_to_string(f).map_err(|e| format!("remote.{key}: cannot read {f}: {e}"))
        };
        return Ok(PlaneTls {
            cert_pem: read("tls_cert", &cfg.tls_cert)?,
            key_pem: read("tls_key", &cfg.tls_key)?,
            ca_pem: read("tls_ca", &cfg.tls_ca)?,
        });
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (ca_pem_path, ca_key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    let existing = std::fs::read_to_string(&ca_key_path)
        .ok()
        .zip(std::fs::read_to_string(&ca_pem_path).ok());
    let (ca_key, ca_pem) = match existing.and_then(|(k, c)| Some((KeyPair::from_pem(&k).ok()?, c)))
    {
        Some(found) => found,
        None => {
            let key = KeyPair::generate().map_err(|e| format!("cannot make the CA key: {e}"))?;
            let cert = ca_params()?
                .self_signed(&key)
                .map_err(|e| format!("cannot make the CA certificate: {e}"))?;
            let pem = cert.pem();
            let write = |p: &Path, t: &str| {
                write_private(p, t).map_err(|e| format!("cannot write {}: {e}", p.display()))
            };
            write(&ca_key_path, &key.serialize_pem())?;
            write(&ca_pem_path, &pem)?;
            (key, pem)
        }
    };
    let mut names = vec![
        host_of(&cfg.url()),
        host_of(&cfg.listen),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ];
    names.retain(|n| !n.is_empty() && n != "0.0.0.0" && n != "::");
    names.sort();
    names.dedup();
    let mut params = CertificateParams::new(names).map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "zergd worker plane");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(|e| format!("cannot make the server key: {e}"))?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("cannot sign the server certificate: {e}"))?;
    Ok(PlaneTls {
        ca_pem,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_from_addresses_and_urls() {
        assert_eq!(host_of("127.0.0.1:7446"), "127.0.0.1");
        assert_eq!(host_of("https://zergd.internal:7446/"), "zergd.internal");
        assert_eq!(host_of("https://[::1]:7446"), "::1");
        assert_eq!(host_of("zergd"), "zergd");
    }

    /// The certificate in `pem` (the first one), as webpki reads it.
    fn der(pem: &str) -> rustls_pki_types::CertificateDer<'static> {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn the_ca_is_minted_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("remote");
        let cfg = RemoteConfig::default();
        let a = tls_material(&d, &cfg).unwrap();
        let b = tls_material(&d, &cfg).unwrap();
        assert_eq!(a.ca_pem, b.ca_pem, "the CA is kept across starts");
        assert_ne!(a.key_pem, b.key_pem, "the server key is new at every start");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&d), 0o700, "the CA's directory is 0700");
        for f in ["ca.pem", "ca.key"] {
            assert_eq!(mode(&d.join(f)), 0o600, "{f} is 0600");
        }
        assert_eq!(
            std::fs::read_to_string(d.join("ca.pem")).unwrap(),
            a.ca_pem,
            "the CA workers are given is the one kept"
        );
        assert!(format!("{a:?}").contains("redacted"));
    }

    /// The server certificate zergd signs chains to its CA, for TLS servers, and names the hosts
    /// of `remote.advertise_url` and `remote.listen`, `localhost` and `127.0.0.1`, and nothing
    /// else (docs/Remote-Workers.md, "Certificates").
    #[test]
    fn the_server_certificate_chains_to_the_ca_and_names_the_plane() {
        use rustls_pki_types::{ServerName, UnixTime};
        let dir = tempfile::tempdir().unwrap();
        let cfg = RemoteConfig {
            listen: "10.1.2.3:7446".into(),
            advertise_url: "https://zergd.example.internal:8446/".into(),
            ..RemoteConfig::default()
        };
        let tls = tls_material(&dir.path().join("remote"), &cfg).unwrap();
        let ca = der(&tls.ca_pem);
        let anchors = [webpki::anchor_from_trusted_cert(&ca).unwrap()];
        let cert = der(&tls.cert_pem);
        let leaf = webpki::EndEntityCert::try_from(&cert).unwrap();
        leaf.verify_for_usage(
            &[webpki::ring::ECDSA_P256_SHA256],
            &anchors,
            &[],
            UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .expect("the server certificate chains to zergd's CA");
        // Another CA (of another state directory) does not vouch for it.
        let other = tls_material(&dir.path().join("other"), &cfg).unwrap();
        let other_ca = der(&other.ca_pem);
        let other_anchors = [webpki::anchor_from_trusted_cert(&other_ca).unwrap()];
        assert!(
            leaf.verify_for_usage(
                &[webpki::ring::ECDSA_P256_SHA256],
                &other_anchors,
                &[],
                UnixTime::now(),
                webpki::KeyUsage::server_auth(),
                None,
                None,
            )
            .is_err()
        );
        let valid_for = |name: &str| {
            leaf.verify_is_valid_for_subject_name(&ServerName::try_from(name).unwrap())
                .is_ok()
        };
        for name in [
            "zergd.example.internal",
            "10.1.2.3",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(valid_for(name), "the certificate names {name}");
        }
        for name in ["example.internal", "other.internal", "10.1.2.4", "0.0.0.0"] {
            assert!(!valid_for(name), "the certificate does not name {name}");
        }
        // A plane on every interface names no wildcard address.
        let any = RemoteConfig {
            listen: "0.0.0.0:7446".into(),
            ..RemoteConfig::default()
        };
        let tls = tls_material(&dir.path().join("remote"), &any).unwrap();
        let cert = der(&tls.cert_pem);
        let leaf = webpki::EndEntityCert::try_from(&cert).unwrap();
        let named = |ip: &'static str| {
            leaf.verify_is_valid_for_subject_name(&ServerName::try_from(ip).unwrap())
                .is_ok()
        };
        assert!(named("127.0.0.1"));
        assert!(!named("0.0.0.0"), "the certificate does not name 0.0.0.0");
    }

    #[test]
    fn operator_files_go_together() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "a readable certificate file\n").unwrap();
        let cfg = RemoteConfig {
            tls_cert: cert.display().to_string(),
            ..RemoteConfig::default()
        };
        let e = tls_material(&dir.path().join("remote"), &cfg).unwrap_err();
        assert!(
            e.starts_with("remote.tls_key is empty")
                && e.contains("remote.tls_cert, remote.tls_key and remote.tls_ca go together"),
            "{e}"
        );
        let cfg = RemoteConfig {
            tls_key: cert.display().to_string(),
            ..cfg
        };
        let e = tls_material(&dir.path().join("remote"), &cfg).unwrap_err();
        assert!(
            e.starts_with("remote.tls_ca is empty") && e.contains("go together"),
            "{e}"
        );
        assert!(
            !dir.path().join("remote").exists(),
            "no CA of zergd's own is minted when the operator names files"
        );
    }
}
