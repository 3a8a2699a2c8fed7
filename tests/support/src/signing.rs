//! OpenPGP test keys made by the real gpg (`scripts/install-gnupg.sh` installs it), and charts
//! signed with them by the real `helm package --sign`, as a chart publisher signs them.

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// A signing key in a gpg home of its own, removed (and its agent stopped) when dropped.
pub struct Signer {
    home: TempDir,
    /// The key's user id, `Name <email>`.
    pub user: String,
    /// The key's fingerprint, upper-case hexadecimal.
    pub fingerprint: String,
}

impl Signer {
    /// A new ed25519 key for `user` (`Name <email>`), without a passphrase.
    pub fn new(user: &str) -> Signer {
        // A short path: gpg-agent's socket must fit in a Unix socket path.
        let home = tempfile::Builder::new()
            .prefix("gpg")
            .tempdir_in("/tmp")
            .expect("a gpg home");
        let mut signer = Signer {
            home,
            user: user.to_string(),
            fingerprint: String::new(),
        };
        let out = signer.gpg(&[
            "--batch",
            "--passphrase",
            "",
            "--quick-gen-key",
            user,
            "default",
            "default",
            "never",
        ]);
        assert!(
            out.status.success(),
            "gpg --quick-gen-key: {}",
            stderr(&out)
        );
        let listed = signer.gpg(&["--with-colons", "--fingerprint", user]);
        let fingerprint = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .find_map(|line| {
                line.strip_prefix("fpr:")
                    .map(|rest| rest.trim_matches(':').to_string())
            })
            .expect("the key's fingerprint");
        let secring = signer.gpg(&["--export-secret-keys", user]);
        assert!(
            secring.status.success(),
            "gpg --export-secret-keys: {}",
            stderr(&secring)
        );
        std::fs::write(signer.secring(), &secring.stdout).unwrap();
        signer.fingerprint = fingerprint;
        signer
    }

    fn gpg(&self, args: &[&str]) -> std::process::Output {
        Command::new("gpg")
            .env("GNUPGHOME", self.home.path())
            .args(args)
            .output()
            .expect("run gpg (is gnupg installed? scripts/install-gnupg.sh)")
    }

    /// The secret keyring in gpg's legacy format, as `helm package --keyring` reads it.
    fn secring(&self) -> PathBuf {
        self.home.path().join("secring.gpg")
    }

    /// The public key, binary (`gpg --export`).
    pub fn public_key(&self) -> Vec<u8> {
        let out = self.gpg(&["--export", &self.user]);
        assert!(out.status.success() && !out.stdout.is_empty());
        out.stdout
    }

    /// The public key, ASCII-armored (`gpg --armor --export`).
    pub fn public_key_armored(&self) -> String {
        let out = self.gpg(&["--armor", "--export", &self.user]);
        assert!(out.status.success() && !out.stdout.is_empty());
        String::from_utf8(out.stdout).unwrap()
    }

    /// Packages and signs the chart directory `chart` into `destination` with `helm package
    /// --sign`: the archive and its `.prov` beside it. The archive's path.
    pub fn package(&self, chart: &Path, destination: &Path) -> PathBuf {
        std::fs::create_dir_all(destination).unwrap();
        let out = Command::new(crate::helm())
            .arg("package")
            .arg("--sign")
            .arg("--key")
            .arg(&self.user)
            .arg("--keyring")
            .arg(self.secring())
            .arg(chart)
            .arg("--destination")
            .arg(destination)
            .output()
            .expect("run helm package --sign");
        assert!(
            out.status.success(),
            "helm package --sign: {}",
            stderr(&out)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        let path = said
            .trim()
            .rsplit(": ")
            .next()
            .map(PathBuf::from)
            .expect("the packaged chart's path");
        assert!(path.is_file(), "{said}");
        let mut prov = path.clone().into_os_string();
        prov.push(".prov");
        assert!(
            Path::new(&prov).is_file(),
            "no .prov beside {}",
            path.display()
        );
        path
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", self.home.path())
            .args(["--kill", "gpg-agent"])
            .output();
    }
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
