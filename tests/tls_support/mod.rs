//! TLS test peers: a certificate authority made at test time with `rcgen`,
//! and a rustls server on loopback that records what each client showed it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{HandshakeKind, ServerConfig, ServerConnection, StreamOwned};

/// A certificate authority that exists for one test.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate chain and its key, ready for a server.
pub struct Leaf {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivatePkcs8KeyDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate in binary (DER), as some tools save it.
    pub fn der(&self) -> Vec<u8> {
        self.issuer.der().to_vec()
    }

    /// Writes the CA certificate as PEM into `dir` and returns the path.
    pub fn write_pem(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.pem()).unwrap();
        path
    }

    /// A leaf for `names` (DNS names or IP addresses), valid now.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |_| {})
    }

    /// A leaf for `names` that expired in 2021.
    pub fn expired_leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |p| {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        })
    }

    fn leaf_with(&self, names: &[&str], tweak: impl FnOnce(&mut CertificateParams)) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        tweak(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            chain: vec![cert.der().clone(), self.issuer.der().clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    }
}

/// A self-signed certificate for `names` that is also marked a CA
/// (`basicConstraints` `CA:TRUE`), as some certificate recipes make one:
/// served as the server's own and trusted as its own root. Returns it ready
/// for a server, and its PEM.
pub fn self_signed_ca_as_server(names: &[&str]) -> (Leaf, String) {
    let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, names.first().copied().unwrap_or("self-signed"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let leaf = Leaf { chain: vec![cert.der().clone()], key: PrivatePkcs8KeyDer::from(key.serialize_der()) };
    (leaf, cert.pem())
}

/// What the server saw of one client connection.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub sni: Option<String>,
    pub resumed: bool,
    pub alpn: Option<Vec<u8>>,
    /// The handshake error on the server's side, if the handshake failed.
    pub error: Option<String>,
}

pub type TlsServerStream = StreamOwned<ServerConnection, TcpStream>;

/// What the server does with each connection once the handshake is done.
pub type Handler = Arc<dyn Fn(&mut TlsServerStream) + Send + Sync>;

/// A rustls server on `127.0.0.1:0`, one thread per connection; it stops
/// accepting when dropped.
pub struct TlsServer {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

pub fn server_config(leaf: &Leaf) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(leaf.chain.clone(), PrivateKeyDer::Pkcs8(leaf.key.clone_key()))
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

impl TlsServer {
    pub fn start(leaf: &Leaf, handler: Handler) -> TlsServer {
        let config = server_config(leaf);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = tcp else { continue };
                let (config, seen, handler) = (config.clone(), seen2.clone(), handler.clone());
                std::thread::spawn(move || serve(tcp, config, seen, handler));
            }
        });
        TlsServer { addr, seen, stop }
    }

    /// What the server saw, once `n` connections have been recorded
    /// (waits up to 10 s for them).
    pub fn seen(&self, n: usize) -> Vec<Seen> {
        for _ in 0..200 {
            let seen = self.seen.lock().unwrap();
            if seen.len() >= n {
                return seen.clone();
            }
            drop(seen);
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the TLS server saw fewer than {n} connections in 10 s");
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(tcp: TcpStream, config: Arc<ServerConfig>, seen: Arc<Mutex<Vec<Seen>>>, handler: Handler) {
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let conn = ServerConnection::new(config).unwrap();
    let mut stream = StreamOwned::new(conn, tcp);
    let mut record = Seen::default();
    while stream.conn.is_handshaking() {
        if let Err(e) = stream.conn.complete_io(&mut stream.sock) {
            record.error = Some(e.to_string());
            break;
        }
    }
    record.sni = stream.conn.server_name().map(str::to_owned);
    record.resumed = stream.conn.handshake_kind() == Some(HandshakeKind::Resumed);
    record.alpn = stream.conn.alpn_protocol().map(<[u8]>::to_vec);
    let ok = record.error.is_none();
    seen.lock().unwrap().push(record);
    if ok {
        handler(&mut stream);
    }
}

/// Echoes every byte back until the client closes.
pub fn echo() -> Handler {
    Arc::new(|stream: &mut TlsServerStream| {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match stream.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    })
}
