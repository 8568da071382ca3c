//! A TLS client stream over a non-blocking `mio` socket, driven by rustls's
//! sans-I/O connection.
//!
//! The stream owns the TCP socket and the rustls client state and nothing else:
//! it never blocks, never reads the clock (the handshake deadline is computed
//! from the `now` it is given and put on the reactor's wheel by its owner), and
//! reads from and writes to the socket only when its owner calls it after a
//! readiness event. Its methods behave like a socket's: `WouldBlock` when
//! nothing can be done now, `Ok(0)` from `read` when the peer closed the
//! session cleanly (`close_notify`).
//!
//! Verification is always on: the server's certificate chain must lead to one
//! of the roots of the [`ClientTls`] it was made from (the bundled Mozilla
//! roots plus the pool's `caFile`) and name the host that was asked for. There
//! is no option to turn that off. A refused handshake is an `io::Error` of
//! kind `InvalidData` carrying a [`TlsError`] that names the cause; get it back
//! with [`TlsError::of`].

use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, ClientConfig, ClientConnection, HandshakeKind, RootCertStore};
use sha2::{Digest, Sha256};

use crate::files;
use crate::time::Ms;

/// The only application protocol offered: the proxy speaks HTTP/1.1 upstream.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Most plaintext and TLS bytes held inside one stream, each way, before
/// `write` answers `WouldBlock` (rustls's own default, said out loud).
const BUFFER_LIMIT: usize = 64 * 1024;

/// How long a handshake may take, from the start of the TCP connect, unless
/// the upstream's `tlsHandshakeTimeoutMs` says otherwise.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// The largest `upstream.caFile` read (the whole Mozilla bundle is about 220 KiB).
const MAX_CA_FILE_BYTES: u64 = 4 << 20;

/// Sessions remembered for resumption per [`ClientTls`] (one per upstream).
const SESSION_CACHE_SIZE: usize = 256;

/// Why a TLS session with an upstream could not be set up or went wrong.
/// Each variant is one cause an operator acts on differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsError {
    /// The certificate chain does not lead to a trusted root.
    UnknownCa,
    /// The certificate does not name the host that was asked for.
    WrongHostName { host: String, presented: Vec<String> },
    /// The certificate's `notAfter` is in the past.
    Expired,
    /// The certificate's `notBefore` is in the future.
    NotYetValid,
    /// The server presented a certificate authority's own certificate
    /// (`basicConstraints` `CA:TRUE`), a self-signed one given as `caFile`
    /// say, rather than one issued by it.
    CaUsedAsEndEntity,
    /// Any other reason the certificate was refused.
    BadCertificate(String),
    /// The upstream sent a fatal alert.
    AlertReceived(String),
    /// The upstream broke the TLS protocol (or is not speaking TLS).
    Protocol(String),
    /// The handshake had not finished by its deadline.
    HandshakeTimeout,
    /// The host is neither a DNS name nor an IP address.
    InvalidHostName(String),
}

impl TlsError {
    /// The TLS cause inside an error returned by [`TlsStream`], if it is one.
    pub fn of(err: &io::Error) -> Option<&TlsError> {
        err.get_ref().and_then(|e| e.downcast_ref::<TlsError>())
    }

    /// Short, stable name of the cause, for logs and metrics labels.
    pub fn cause(&self) -> &'static str {
        match self {
            TlsError::UnknownCa => "unknown_ca",
            TlsError::WrongHostName { .. } => "wrong_host_name",
            TlsError::Expired => "certificate_expired",
            TlsError::NotYetValid => "certificate_not_yet_valid",
            TlsError::CaUsedAsEndEntity => "ca_used_as_end_entity",
            TlsError::BadCertificate(_) => "bad_certificate",
            TlsError::AlertReceived(_) => "alert_received",
            TlsError::Protocol(_) => "protocol_error",
            TlsError::HandshakeTimeout => "handshake_timeout",
            TlsError::InvalidHostName(_) => "invalid_host_name",
        }
    }

    /// One sentence for the client that got `502 bad_gateway` because of it;
    /// fixed text, so no answer carries the upstream's details.
    pub fn sentence(&self) -> &'static str {
        match self {
            TlsError::UnknownCa => "The upstream's TLS certificate is not signed by a trusted certificate authority.",
            TlsError::WrongHostName { .. } => "The upstream's TLS certificate is not valid for its host name.",
            TlsError::Expired => "The upstream's TLS certificate has expired.",
            TlsError::NotYetValid => "The upstream's TLS certificate is not valid yet.",
            TlsError::CaUsedAsEndEntity => {
                "The upstream's TLS certificate is a certificate authority's, not one issued for the server."
            }
            TlsError::BadCertificate(_) => "The upstream's TLS certificate was refused.",
            TlsError::AlertReceived(_) => "The upstream refused the TLS handshake.",
            TlsError::Protocol(_) => "TLS with the upstream failed.",
            TlsError::HandshakeTimeout => "The TLS handshake with the upstream did not finish in time.",
            TlsError::InvalidHostName(_) => "The upstream's host name cannot be verified by TLS.",
        }
    }

    fn from_rustls(err: rustls::Error, host: &str) -> TlsError {
        match err {
            rustls::Error::InvalidCertificate(cert) => match cert {
                CertificateError::UnknownIssuer => TlsError::UnknownCa,
                CertificateError::NotValidForName => {
                    TlsError::WrongHostName { host: host.to_owned(), presented: Vec::new() }
                }
                CertificateError::NotValidForNameContext { presented, .. } => TlsError::WrongHostName {
                    host: host.to_owned(),
                    presented: presented.iter().map(|name| plain_name(name).to_owned()).collect(),
                },
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => TlsError::Expired,
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => TlsError::NotYetValid,
                // rustls has no variant of its own for this one: it passes
                // webpki's error on inside `Other`.
                CertificateError::Other(other)
                    if other.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity) =>
                {
                    TlsError::CaUsedAsEndEntity
                }
                other => TlsError::BadCertificate(format!("{other:?}")),
            },
            rustls::Error::AlertReceived(alert) => TlsError::AlertReceived(format!("{alert:?}")),
            other => TlsError::Protocol(other.to_string()),
        }
    }

    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }
}

/// A certificate name as webpki's debug text gives it (`DnsName("a.test")`,
/// `IpAddress(10.0.0.1)`), as an operator would write it (`a.test`,
/// `10.0.0.1`); other kinds stay as they are.
fn plain_name(presented: &str) -> &str {
    let unwrap = |prefix: &str, suffix: &str| presented.strip_prefix(prefix)?.strip_suffix(suffix);
    unwrap("DnsName(\"", "\")").or_else(|| unwrap("IpAddress(", ")")).unwrap_or(presented)
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::UnknownCa => {
                f.write_str("the upstream's certificate is not signed by a trusted certificate authority")
            }
            TlsError::WrongHostName { host, presented } if presented.is_empty() => {
                write!(f, "the upstream's certificate is not valid for the host name {host}")
            }
            TlsError::WrongHostName { host, presented } => write!(
                f,
                "the upstream's certificate is not valid for the host name {host} (it names {})",
                presented.join(", ")
            ),
            TlsError::Expired => f.write_str("the upstream's certificate has expired"),
            TlsError::NotYetValid => f.write_str("the upstream's certificate is not valid yet"),
            TlsError::CaUsedAsEndEntity => f.write_str(
                "the upstream's certificate is a certificate authority's own (CA:TRUE), which TLS refuses as a \
                 server's; serve a certificate issued by that CA for the host name instead of the CA certificate \
                 itself (the CA certificate stays in caFile)",
            ),
            TlsError::BadCertificate(why) => {
                write!(f, "the upstream's certificate was refused: {why}")
            }
            TlsError::AlertReceived(alert) => {
                write!(f, "the upstream ended the TLS handshake with the alert {alert}")
            }
            TlsError::Protocol(why) => write!(f, "TLS with the upstream failed: {why}"),
            TlsError::HandshakeTimeout => f.write_str("the TLS handshake with the upstream did not finish in time"),
            TlsError::InvalidHostName(host) => {
                write!(f, "{host:?} is not a host name TLS can verify")
            }
        }
    }
}

impl std::error::Error for TlsError {}

/// Why a [`ClientTls`] could not be built from the configuration.
#[derive(Debug)]
pub enum TlsConfigError {
    /// `caFile` could not be read or holds no usable PEM certificate.
    CaFile { path: PathBuf, why: String },
    /// The crypto provider refused the protocol versions (a build defect).
    Provider(String),
}

impl fmt::Display for TlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsConfigError::CaFile { path, why } => write!(f, "caFile {}: {why}", path.display()),
            TlsConfigError::Provider(why) => write!(f, "TLS set-up failed: {why}"),
        }
    }
}

impl std::error::Error for TlsConfigError {}

/// The TLS settings of one upstream, shared by all its connections: trusted
/// roots, ALPN and the session cache that lets a new connection resume an
/// earlier session instead of a full handshake. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    handshake_timeout_ms: Ms,
    /// Which settings these are (`identity`).
    generation: u64,
    /// SHA-256 over the DER of the roots `caFile` added, in order: what a
    /// later build is compared by (`same_as`).
    ca_digest: [u8; 32],
}

/// The `generation` of the next `ClientTls` built: 1, 2, … (0 names none).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the bundled Mozilla roots, plus every certificate in `ca_file`
    /// (PEM) when given.
    pub fn new(ca_file: Option<&Path>) -> Result<ClientTls, TlsConfigError> {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let mut digest = Sha256::new();
        if let Some(path) = ca_file {
            for cert in add_ca_file(&mut roots, path)? {
                digest.update((cert.len() as u64).to_be_bytes());
                digest.update(&cert);
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsConfigError::Provider(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        config.resumption = rustls::client::Resumption::in_memory_sessions(SESSION_CACHE_SIZE);
        Ok(ClientTls {
            config: Arc::new(config),
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
            ca_digest: digest.finalize().into(),
        })
    }

    /// The same settings with handshakes allowed `ms` from the connect.
    pub fn with_handshake_timeout(mut self, ms: Ms) -> ClientTls {
        self.handshake_timeout_ms = ms;
        self
    }

    /// Which trust settings these are: the same for this value and its
    /// clones, and for no other built in this process (never 0). A reload
    /// builds new ones; a connection verified under the old ones is not
    /// reused under the new ones. (Not the settings' address: a TLS 1.2
    /// session keeps no reference to them, so a later build may take it.)
    pub fn identity(&self) -> u64 {
        self.generation
    }

    /// Whether `other` (a build from a reloaded configuration) trusts the
    /// same roots with the same handshake timeout: then these settings, their
    /// kept-alive connections and their session cache go on in its place.
    pub fn same_as(&self, other: &ClientTls) -> bool {
        self.ca_digest == other.ca_digest && self.handshake_timeout_ms == other.handshake_timeout_ms
    }

    /// How long a handshake of this upstream may take, from the connect.
    pub fn handshake_timeout_ms(&self) -> Ms {
        self.handshake_timeout_ms
    }

    /// Starts a client session with `host` over `tcp` (connected or still
    /// connecting). `handshake_deadline` is the instant, on the caller's
    /// clock, after which [`TlsStream::check_deadline`] fails the handshake.
    pub fn connect(&self, tcp: TcpStream, host: &str, handshake_deadline: Ms) -> Result<TlsStream, TlsError> {
        let name = ServerName::try_from(host.to_owned()).map_err(|_| TlsError::InvalidHostName(host.to_owned()))?;
        let mut conn = ClientConnection::new(self.config.clone(), name).map_err(|e| TlsError::from_rustls(e, host))?;
        conn.set_buffer_limit(Some(BUFFER_LIMIT));
        Ok(TlsStream { tcp, conn, host: host.into(), handshake_deadline, failure: None, sent: 0 })
    }
}

/// Adds the certificates of `path` to `roots`; returns them (their DER).
fn add_ca_file(roots: &mut RootCertStore, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let fail = |why: String| TlsConfigError::CaFile { path: path.to_owned(), why };
    let pem = files::read_bounded(path, MAX_CA_FILE_BYTES).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let mut added = Vec::new();
    for (line, cert) in ca_certificates(&pem).map_err(fail)? {
        roots
            .add(cert.clone())
            .map_err(|_| fail(format!("the CERTIFICATE block at line {line} is not a valid X.509 certificate")))?;
        added.push(cert);
    }
    Ok(added)
}

/// The certificates of a `caFile`'s text, each with the line its block
/// begins on, or why the file cannot be used, in words that name the block
/// and its line: an operator fixes the file from this, so no byte list or
/// parser error name reaches them. The blocks are found here and each is
/// decoded by rustls's PEM parser; blocks of other kinds are passed over.
fn ca_certificates(pem: &[u8]) -> Result<Vec<(usize, CertificateDer<'static>)>, String> {
    const BEGIN: &[u8] = b"-----BEGIN ";
    const END: &[u8] = b"-----END ";
    const DASHES: &[u8] = b"-----";
    let mut certs = Vec::new();
    let mut others: Vec<String> = Vec::new();
    // The block being read: the line it began on, its label, and where its
    // BEGIN line starts in the file.
    let mut open: Option<(usize, &[u8], usize)> = None;
    // Lines end at `\n` or, as the parser also takes, at a lone `\r`; they
    // are numbered by the `\n`s, as an editor shows them.
    let (mut number, mut start) = (1, 0);
    for part in pem.split(|&b| b == b'\n' || b == b'\r') {
        let (line, at) = (number, start);
        start += part.len() + 1;
        if pem.get(start - 1) == Some(&b'\n') {
            number += 1;
        }
        let text = part.trim_ascii_end();
        if let Some(rest) = text.strip_prefix(BEGIN) {
            if let Some((began, label, _)) = open {
                return Err(format!(
                    "the {} block at line {began} has no END line before the BEGIN line at line {line}",
                    shown(label)
                ));
            }
            let Some(label) = rest.strip_suffix(DASHES).filter(|label| !label.ends_with(b"-")) else {
                return Err(format!(
                    "line {line} (\"{}\") is not a well-formed BEGIN line, which ends in five dashes",
                    shown(text)
                ));
            };
            open = Some((line, label, at));
        } else if let Some(rest) = text.strip_prefix(END) {
            // An END line outside a block is passed over, as the parser does.
            let Some((began, label, from)) = open else {
                continue;
            };
            if !rest.strip_prefix(label).is_some_and(|r| r.starts_with(DASHES)) {
                if label == b"CERTIFICATE" {
                    return Err(format!(
                        "the CERTIFICATE block at line {began} is ended by line {line} (\"{}\"), which names \
                         another kind",
                        shown(text)
                    ));
                }
                // The parser reads it as part of the block, which is passed over.
                continue;
            }
            open = None;
            if label == b"CERTIFICATE" {
                let block = &pem[from..start.min(pem.len())];
                certs.push((began, certificate(block, began)?));
            } else if !others.iter().any(|o| o.as_bytes() == label) {
                others.push(shown(label));
            }
        }
    }
    if let Some((began, label, _)) = open {
        let label = shown(label);
        return Err(format!(
            "ends inside the {label} block at line {began}, with no \"-----END {label}-----\" line: it looks cut short"
        ));
    }
    if certs.is_empty() {
        let why = if pem.iter().all(u8::is_ascii_whitespace) {
            "holds no PEM certificate: it is empty".to_owned()
        } else if !others.is_empty() {
            format!("holds no PEM certificate, only blocks of other kinds ({})", others.join(", "))
        } else if pem.first() == Some(&0x30) {
            // A DER certificate is an ASN.1 SEQUENCE: its first byte is 0x30.
            "holds no PEM certificate: it looks like a binary (DER) certificate, which must be converted to PEM \
             first (openssl x509 -inform der)"
                .to_owned()
        } else {
            "holds no PEM certificate: it has no \"-----BEGIN CERTIFICATE-----\" line".to_owned()
        };
        return Err(why);
    }
    Ok(certs)
}

/// The certificate of one `CERTIFICATE` block (its BEGIN line to its END
/// line), begun at line `began`.
fn certificate(block: &[u8], began: usize) -> Result<CertificateDer<'static>, String> {
    CertificateDer::from_pem_slice(block).map_err(|e| match e {
        pem::Error::Base64Decode(_) => {
            format!("the base64 text of the CERTIFICATE block at line {began} is damaged: it does not decode")
        }
        pem::Error::SectionTooLarge => format!("the CERTIFICATE block at line {began} is larger than 256 MB"),
        _ => format!("the CERTIFICATE block at line {began} is not valid PEM"),
    })
}

/// A label or a line of a PEM file as text for a message: invalid UTF-8
/// and control characters escaped, at most 64 characters.
fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut shown: String = text.chars().take(64).flat_map(char::escape_debug).collect();
    if text.chars().nth(64).is_some() {
        shown.push('…');
    }
    shown
}

/// One TLS client session over a non-blocking TCP socket.
pub struct TlsStream {
    tcp: TcpStream,
    conn: ClientConnection,
    host: Box<str>,
    handshake_deadline: Ms,
    /// The first fatal error, returned again by every later call.
    failure: Option<TlsError>,
    /// Bytes of TLS records written to the socket so far.
    sent: u64,
}

impl fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStream")
            .field("host", &self.host)
            .field("handshaking", &self.conn.is_handshaking())
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

/// Whoever closes the connection (idle eviction, an exchange that ends it,
/// shutdown), the upstream is told with a `close_notify` that the session
/// ended on purpose, as far as the socket takes the alert at once: the send
/// buffer of a socket with nothing queued always does. Not after a failure
/// (the session is gone) nor during a handshake (there is no session yet).
impl Drop for TlsStream {
    fn drop(&mut self) {
        if self.failure.is_none() && !self.conn.is_handshaking() {
            self.close();
        }
    }
}

impl TlsStream {
    /// The socket, for registration with the poll.
    pub fn tcp(&mut self) -> &mut TcpStream {
        &mut self.tcp
    }

    /// Reads decrypted bytes. Drives the handshake as a side effect, so the
    /// owner calls it on every readable event, handshake or not.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check_failed()?;
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // No plaintext buffered: take more records off the socket.
            match self.conn.read_tls(&mut self.tcp) {
                Ok(0) => {
                    // EOF: the reader answers next round (clean close or
                    // `UnexpectedEof` for a truncated session).
                    self.process()?;
                    return match self.conn.reader().read(buf) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::ErrorKind::UnexpectedEof.into()),
                        other => other,
                    };
                }
                Ok(_) => self.process()?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Accepts up to `data.len()` plaintext bytes, encrypted and sent as the
    /// socket allows; `WouldBlock` when the internal buffer is full. Before
    /// the handshake is done the bytes wait inside the session.
    pub fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.check_failed()?;
        self.push()?;
        let n = self.conn.writer().write(data)?;
        self.push()?;
        if n == 0 && !data.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    /// Sends what is queued; `WouldBlock` while bytes are still waiting for
    /// the socket.
    pub fn flush(&mut self) -> io::Result<()> {
        self.check_failed()?;
        self.push()?;
        if self.conn.wants_write() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(())
    }

    /// Bytes of TLS records written to the socket so far (plaintext the
    /// session accepted may still wait inside it).
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// True until the handshake has completed.
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// The instant by which the handshake must finish, while it has not.
    pub fn handshake_deadline(&self) -> Option<Ms> {
        self.conn.is_handshaking().then_some(self.handshake_deadline)
    }

    /// Called when the handshake deadline fires: fails the stream with
    /// [`TlsError::HandshakeTimeout`] if the handshake is still going at `now`.
    pub fn check_deadline(&mut self, now: Ms) -> Result<(), TlsError> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        if self.conn.is_handshaking() && now >= self.handshake_deadline {
            self.failure = Some(TlsError::HandshakeTimeout);
            return Err(TlsError::HandshakeTimeout);
        }
        Ok(())
    }

    /// True when this session was resumed from an earlier one instead of a
    /// full handshake (known once the handshake is done).
    pub fn resumed(&self) -> bool {
        self.conn.handshake_kind() == Some(HandshakeKind::Resumed)
    }

    /// The negotiated application protocol, if the server chose one.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    /// Queues a `close_notify` and sends what the socket takes now, never
    /// waiting for it. Dropping a stream whose session is up does this.
    pub fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.push();
    }

    fn check_failed(&self) -> io::Result<()> {
        match &self.failure {
            Some(failure) => Err(failure.clone().into_io()),
            None => Ok(()),
        }
    }

    /// Decrypts what `read_tls` took in and sends any reply the session
    /// queued (handshake messages, or the alert that refuses a certificate).
    fn process(&mut self) -> io::Result<()> {
        let result = self.conn.process_new_packets();
        // Best effort: a refusing alert reaches the peer if the socket takes it.
        let pushed = self.push();
        if let Err(err) = result {
            let failure = TlsError::from_rustls(err, &self.host);
            log::debug!("tls to {}: {failure}", self.host);
            self.failure = Some(failure.clone());
            return Err(failure.into_io());
        }
        match pushed {
            // The peer closed: what it sent before is still read (an answer
            // to a request it did not read whole); a write says it failed.
            Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => Ok(()),
            other => other,
        }
    }

    /// Writes queued TLS records until the socket would block or none are left.
    fn push(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.tcp) {
                Ok(n) => self.sent += n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Not yet connected: the bytes go out on the writable event.
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{ca_certificates, plain_name, ClientTls};

    /// Each build is its own settings, whatever address it lands at once an
    /// earlier one is dropped; a clone is the same settings.
    #[test]
    fn every_build_of_the_settings_is_told_apart_and_a_clone_is_not() {
        let first = ClientTls::new(None).unwrap();
        let id = first.identity();
        assert_eq!(first.clone().identity(), id);
        drop(first);
        for _ in 0..8 {
            assert_ne!(ClientTls::new(None).unwrap().identity(), id);
        }
        let (a, b) = (ClientTls::new(None).unwrap(), ClientTls::new(None).unwrap());
        assert!(a.same_as(&b), "the same roots");
        assert!(!a.same_as(&b.with_handshake_timeout(1)), "another handshake timeout");
    }

    /// A self-signed certificate as PEM, and its DER.
    fn cert(name: &str) -> (String, Vec<u8>) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        (made.cert.pem(), made.cert.der().to_vec())
    }

    fn refusal(pem: &str) -> String {
        let why = ca_certificates(pem.as_bytes()).map(|certs| certs.len()).unwrap_err();
        // Words only: no byte list, no parser error's debug name.
        assert!(!why.contains('[') && !why.contains("Error") && !why.contains("Invalid"), "{why}");
        why
    }

    #[test]
    fn a_ca_file_s_certificates_are_found_whatever_its_line_ends_and_other_blocks() {
        let (one, one_der) = cert("one.test");
        let (two, two_der) = cert("two.test");
        let key = "-----BEGIN PRIVATE KEY-----\nAAECAwQFBgcICQ==\n-----END PRIVATE KEY-----\n";
        let odd = "-----BEGIN X-----\nabc\n-----END Y-----\n-----END X-----\n-----END CERTIFICATE-----\n";
        let text = format!("our roots\n{key}{one}{odd}{two}");
        let lines_of_one = one.lines().count();
        for ends in ["\n", "\r\n", "\r"] {
            let file = text.replace('\n', ends);
            let found = ca_certificates(file.as_bytes()).unwrap();
            let ders: Vec<&[u8]> = found.iter().map(|(_, c)| c.as_ref()).collect();
            assert_eq!(ders, [&one_der[..], &two_der[..]], "{ends:?}");
            if ends != "\r" {
                assert_eq!(found[0].0, 5, "{ends:?}");
                assert_eq!(found[1].0, 5 + lines_of_one + 5, "{ends:?}");
            }
        }
    }

    #[test]
    fn a_ca_file_that_cannot_be_used_is_said_in_words_naming_the_line() {
        let (one, _) = cert("one.test");
        let lines: Vec<&str> = one.lines().collect();
        let cut = lines[..lines.len() - 2].join("\n");
        let why = refusal(&format!("\n{cut}"));
        assert!(why.starts_with("ends inside the CERTIFICATE block at line 2") && why.contains("cut short"), "{why}");
        let mut garbled = lines.clone();
        let line = format!("{}*{}", &lines[1][..5], &lines[1][6..]);
        garbled[1] = &line;
        let why = refusal(&garbled.join("\n"));
        assert!(why.contains("base64 text of the CERTIFICATE block at line 1 is damaged"), "{why}");
        let why = refusal(&one.replacen("CERTIFICATE-----", "CERTIFICATE---", 1));
        assert!(why.starts_with("line 1 (\"-----BEGIN CERTIFICATE---\") is not a well-formed BEGIN line"), "{why}");
        let why = refusal(&one.replacen("-----END CERTIFICATE", "-----END PRIVATE KEY", 1));
        assert!(why.contains("ended by line") && why.contains("-----END PRIVATE KEY-----"), "{why}");
        let why = refusal(&format!("{}\n{one}", lines[..3].join("\n")));
        assert!(
            why.contains("the CERTIFICATE block at line 1 has no END line before the BEGIN line at line 4"),
            "{why}"
        );
        let why = refusal("-----BEGIN RSA PRIVATE KEY-----\nAAEC\n-----END RSA PRIVATE KEY-----\n");
        assert_eq!(why, "holds no PEM certificate, only blocks of other kinds (RSA PRIVATE KEY)");
        assert_eq!(refusal(" \n\n"), "holds no PEM certificate: it is empty");
        assert!(refusal("\u{30}\u{82}\u{1}binary").contains("binary (DER) certificate"));
        assert!(refusal("our CA is on the wiki\n").contains("has no \"-----BEGIN CERTIFICATE-----\" line"));
        // A label that is not text is shown escaped, never as bytes.
        let why = ca_certificates(b"-----BEGIN \xff\x01-----\nAAEC\n").unwrap_err();
        assert!(why.starts_with("ends inside the \u{fffd}\\u{1} block at line 1"), "{why}");
    }

    #[test]
    fn certificate_names_read_as_an_operator_writes_them() {
        assert_eq!(plain_name(r#"DnsName("api.example.com")"#), "api.example.com");
        assert_eq!(plain_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(plain_name("IpAddress(fd00::1)"), "fd00::1");
        assert_eq!(plain_name("DirectoryName"), "DirectoryName");
        assert_eq!(
            plain_name(r#"UniformResourceIdentifier("spiffe://x")"#),
            r#"UniformResourceIdentifier("spiffe://x")"#
        );
    }
}
