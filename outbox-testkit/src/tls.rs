//! Certificates for tests of TLS: a private certificate authority, made with the `openssl`
//! command in a temporary directory, that signs server certificates for the names a test asks
//! for. Nothing here is fit for production (one-day validity, keys unprotected on disk).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::unique::unique_token;

/// A certificate authority of the test's own: `ca.pem` signs what [`TestCa::issue`] makes.
#[derive(Debug)]
pub struct TestCa {
    dir: tempfile::TempDir,
}

/// A certificate [`TestCa::issue`] signed, with its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, unencrypted).
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA with a unique name. Fails, saying how to get it, when `openssl` is missing.
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().expect("a temporary directory for the CA");
        let ca = TestCa { dir };
        let subject = format!("/CN=outbox test CA {}", unique_token());
        ca.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        ca
    }

    /// The CA's certificate (PEM): what a client is given to verify servers with.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A server certificate for `names` (DNS names or IP addresses, as its subject alternative
    /// names; the first is also its common name), signed by this CA.
    pub fn issue(&self, names: &[&str]) -> Issued {
        let first = names
            .first()
            .expect("at least one name for the certificate");
        let stem = format!("server-{}", unique_token());
        let sans = names
            .iter()
            .map(|n| {
                if n.parse::<std::net::IpAddr>().is_ok() {
                    format!("IP:{n}")
                } else {
                    format!("DNS:{n}")
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        let ext = self.dir.path().join(format!("{stem}.ext"));
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={sans}\nbasicConstraints=CA:FALSE\n\
                 keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n"
            ),
        )
        .expect("write the certificate extensions");
        let (key, csr, cert) = (
            format!("{stem}.key"),
            format!("{stem}.csr"),
            format!("{stem}.pem"),
        );
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={first}"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            &cert,
            "-extfile",
            &ext.to_string_lossy(),
        ]);
        Issued {
            cert: self.dir.path().join(cert),
            key: self.dir.path().join(key),
        }
    }

    fn openssl(&self, args: &[&str]) {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "run `openssl` to make test certificates: {e}; install it \
                     (Debian: apt-get install openssl)"
                )
            });
        assert!(
            output.status.success(),
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The directory holding the CA's files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}
