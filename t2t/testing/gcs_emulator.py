"""A Google Cloud Storage emulator on 127.0.0.1 that every GCS client of a t2t run reaches, with a
front that injects the store's faults on request.

A t2t run talks to GCS through three clients, each pointed at the emulator its own way:

- TensorFlow's file system (`tf.io.gfile`: etils.epath's gs:// backend when TensorFlow is
  installed, tf.data's readers, seqio's vocabularies). Its endpoints (www.googleapis.com and
  storage.googleapis.com) are compiled in, but its libcurl honours `https_proxy` and
  `CURL_CA_BUNDLE`: the front accepts CONNECT, ends TLS with a certificate for those hosts
  signed by a throwaway certificate authority made at start, and passes the requests on in
  plain HTTP. `GOOGLE_AUTH_TOKEN_FOR_TESTING` skips OAuth, `NO_GCE_CHECK` the metadata server.
- TensorStore (Orbax's arrays): `TENSORSTORE_GCS_HTTP_URL` names the front.
- google-cloud-storage (t2t's lock and reachability check, Orbax's bucket query):
  `STORAGE_EMULATOR_HOST` names the front, and the client goes anonymous.

Behind the front runs gcp-storage-emulator (pure Python, from PyPI) in memory, corrected here
where t2t relies on GCS behaviour it lacks: preconditions (`ifGenerationMatch`,
`ifGenerationNotMatch`, `ifMetagenerationMatch`: 412, or 304 for a read), the
`x-goog-generation` headers of downloads, empty uploads (the objects TensorFlow writes for
directories), the status of a resumable upload that has no byte yet, a bucket's storage layout
(TensorFlow asks before it renames a directory), hard deletes and no per-write rewrite of its
whole index.

Faults (`Emulator.set_faults`): at a given rate, requests of the chosen kinds of operation get
a 429 or 503 answer, their connection reset before the request reaches the store or after it
was applied (the answer lost), or a stall before they are passed on. `Emulator.stats()` counts
requests by operation and faults by kind. Only 127.0.0.1 is ever contacted.

    with Emulator(buckets=["bucket"]) as gcs:
        subprocess.run([..., "--gin.MODEL_DIR='gs://bucket/run'"], env={**os.environ, **gcs.env})

From a shell (prints the environment to export, then serves until interrupted):

    python -m t2t.testing.gcs_emulator --bucket bucket
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import random
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com")
ADMIN = "/_t2t/"
OPERATIONS = ("read", "stat", "list", "write", "delete")
FAULTS = ("429", "503", "reset", "reset-after", "stall")


# -- the emulator process -------------------------------------------------------------------------


def _certificates(directory: str) -> tuple[str, str]:
    """A throwaway certificate authority and a certificate for GCS's hosts signed by it; returns
    (the authority's PEM file, the host certificate + key PEM file)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=7))
    authority_key = ec.generate_private_key(ec.SECP256R1())
    host_key = ec.generate_private_key(ec.SECP256R1())
    authority = _authority_certificate(authority_key, valid)
    host = _host_certificate(host_key, authority, authority_key, valid)
    pem = serialization.Encoding.PEM
    authority_file = os.path.join(directory, "ca.pem")
    host_file = os.path.join(directory, "host.pem")
    with open(authority_file, "wb") as f:
        f.write(authority.public_bytes(pem))
    with open(host_file, "wb") as f:
        f.write(host.public_bytes(pem))
        f.write(
            host_key.private_bytes(
                pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return authority_file, host_file


def _authority_certificate(key, valid):
    """A self-signed certificate authority that may sign host certificates only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t2t GCS emulator CA")])
    unused = (
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "encipher_only",
        "decipher_only",
    )
    usage = x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, crl_sign=True, **dict.fromkeys(unused, False)
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _host_certificate(key, authority, authority_key, valid):
    """A certificate for every host of `HOSTS`, signed by `authority`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]))
        .issuer_name(authority.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority_key.public_key()), False
        )
        .sign(authority_key, hashes.SHA256())
    )


def _corrected_emulator():
    """gcp-storage-emulator's server module, corrected where GCS behaves otherwise (see the
    module docstring)."""
    from gcp_storage_emulator import server, settings
    from gcp_storage_emulator.handlers import objects
    from gcp_storage_emulator.storage import Storage

    if getattr(server, "_t2t_corrected", False):
        return server
    # Its answers go out in two writes (head, body): without TCP_NODELAY each waits 40 ms for
    # the client's delayed acknowledgement.
    server.RequestHandler.disable_nagle_algorithm = True
    # In memory there is nothing to persist: its index rewrite on every write is quadratic.
    Storage._write_config_to_file = lambda self: None
    Storage._bucket_soft_delete_retention_seconds = lambda self, bucket: 0
    objects._resumable_incomplete = _resumable_incomplete
    corrections = _Preconditions(objects)
    layout = (
        rf"^{settings.API_ENDPOINT}/b/(?P<bucket_name>[-.\w]+)/storageLayout$",
        {"GET": _storage_layout},
    )
    server.HANDLERS = (layout,) + tuple(
        (
            pattern,
            {method: corrections.wrap(_offsets(h, objects)) for method, h in handlers.items()},
        )
        for pattern, handlers in server.HANDLERS
    )
    objects.insert = corrections.wrap(objects.insert)  # the router's fallback for uploads
    server._t2t_corrected = True
    return server


def _offsets(handler, objects):
    """The object listing with GCS's `startOffset` and `endOffset` (names in [start, end)),
    which the emulator ignores: TensorStore deletes a key range by listing it, and without them
    deleted every object of the bucket."""
    if handler is not objects.ls:
        return handler

    def run(request, response, storage, *args, **kwargs):
        start = (request.query.get("startOffset") or [None])[0]
        end = (request.query.get("endOffset") or [None])[0]
        if start is None and end is None:
            return handler(request, response, storage, *args, **kwargs)
        answer = response.json

        def within(data):
            keep = lambda n: (start is None or n >= start) and (end is None or n < end)  # noqa: E731
            items = [item for item in data.get("items", []) if keep(item["name"])]
            answer(
                {
                    **data,
                    "items": items,
                    "prefixes": [p for p in data.get("prefixes", []) if keep(p)],
                }
            )

        response.json = within
        return handler(request, response, storage, *args, **kwargs)

    return run


def _resumable_incomplete(response, storage, upload_id, fallback_end=0):
    """GCS sends no Range at all while no byte is persisted; "bytes=0-0" (the emulator's) says
    one byte was, and a client resuming from byte 1 is then refused."""
    from gcp_storage_emulator.handlers.objects import GoogleHTTPStatus

    response.status = GoogleHTTPStatus.RESUME_INCOMPLETE
    received = storage.get_resumable_byte_count(upload_id)
    if received > 0:
        response["Range"] = f"bytes=0-{received - 1}"


def _storage_layout(request, response, storage, *args, **kwargs):
    """TensorFlow asks before renaming a "directory"; a flat namespace is GCS's default."""
    from http import HTTPStatus

    bucket = request.params["bucket_name"]
    if bucket not in storage.buckets:
        response.status = HTTPStatus.NOT_FOUND
        return
    response.json(
        {
            "kind": "storage#storageLayout",
            "bucket": bucket,
            "location": "US",
            "locationType": "multi-region",
            "hierarchicalNamespace": {"enabled": False},
        }
    )


class _Preconditions:
    """The emulator's object handlers with GCS's generation preconditions (`ifGenerationMatch`
    and the like: 412, or 304 for a read) and generation headers on reads."""

    _FAILED = {
        "error": {
            "code": 412,
            "message": "At least one of the pre-conditions you specified did not hold.",
        }
    }

    def __init__(self, objects):
        self.insert, self.copy, self.rewrite = objects.insert, objects.copy, objects.rewrite
        self.compose, self.get, self.download = objects.compose, objects.get, objects.download
        self.delete, self.patch = objects.delete, objects.patch

    @staticmethod
    def generations(storage, bucket, name) -> tuple[int, int] | None:
        """(generation, metageneration) of an object, or None where there is none."""
        from gcp_storage_emulator.exceptions import NotFound

        try:
            record = storage.get_file_obj(bucket, name)
        except NotFound:
            return None
        return int(record["generation"]), int(record.get("metageneration") or 1)

    def target(self, handler, request) -> tuple[str, str] | None:
        """(bucket, object) a request to `handler` acts on; None for other requests."""
        params = request.params or {}
        if handler is self.insert:
            if "name" in request.query:
                return params["bucket_name"], request.query["name"][0]
            data = request.data
            meta = data.get("meta", data) if isinstance(data, dict) else {}
            return params["bucket_name"], meta.get("name", "")
        if handler in (self.copy, self.rewrite):
            return params["dest_bucket_name"], params["dest_object_id"]
        if handler in (self.get, self.download, self.delete, self.patch, self.compose):
            return params["bucket_name"], params["object_id"]
        return None

    def refused(self, handler, request, storage) -> int | None:
        """The status a failed precondition answers with (412, or 304 for a read), or None."""
        where = self.target(handler, request)
        query = request.query
        if where is None or not any(k.startswith(("ifGeneration", "ifMetag")) for k in query):
            return None
        found = self.generations(storage, *where)
        if found is None and handler not in (self.insert, self.copy, self.rewrite):
            return None  # the handler answers 404
        generation, metageneration = found or (0, 0)
        unmet = 304 if handler in (self.get, self.download) else 412
        value = lambda key: int(query[key][0])  # noqa: E731
        if "ifGenerationMatch" in query and value("ifGenerationMatch") != generation:
            return 412
        if "ifMetagenerationMatch" in query and value("ifMetagenerationMatch") != metageneration:
            return 412
        if "ifGenerationNotMatch" in query and value("ifGenerationNotMatch") == generation:
            return unmet
        if (
            "ifMetagenerationNotMatch" in query
            and value("ifMetagenerationNotMatch") == metageneration
        ):
            return unmet
        return None

    def wrap(self, handler):
        """`handler` answering failed preconditions itself, and with generation headers on a
        read's answer."""

        def run(request, response, storage, *args, **kwargs):
            from http import HTTPStatus

            if handler is self.insert and request.data is None:
                request._data = b""  # an empty media upload (a "directory" object)
            status = self.refused(handler, request, storage)
            if status is not None:
                response.status = HTTPStatus(status)
                if status == 412:
                    response.json(self._FAILED)
                return None
            result = handler(request, response, storage, *args, **kwargs)
            reading = handler is self.download or (
                handler is self.get and request.query.get("alt", [""])[0] == "media"
            )
            if reading and response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
                params = request.params
                found = self.generations(storage, params["bucket_name"], params["object_id"])
                if found is not None:
                    response["x-goog-generation"] = str(found[0])
                    response["x-goog-metageneration"] = str(found[1])
            return result

        run.__wrapped__ = handler
        return run


class _Faults:
    """Which requests fail, and how: a plan set through the admin endpoint, and counts."""

    def __init__(self):
        self.lock = threading.Lock()
        self.plan: dict[str, Any] = {}
        self.random = random.Random(0)
        self.requests: dict[str, int] = dict.fromkeys(OPERATIONS, 0)
        self.injected: dict[str, int] = {}

    def set(self, plan: dict[str, Any]) -> None:
        with self.lock:
            self.plan = dict(plan)
            self.random = random.Random(plan.get("seed", 0))

    def draw(self, operation: str) -> str | None:
        with self.lock:
            self.requests[operation] = self.requests.get(operation, 0) + 1
            plan = self.plan
            if not plan or operation not in plan.get("operations", OPERATIONS):
                return None
            limit = plan.get("limit")
            if limit is not None and sum(self.injected.values()) >= limit:
                return None
            if self.random.random() >= float(plan.get("rate", 0.0)):
                return None
            kind = self.random.choice(list(plan.get("kinds", FAULTS)))
            key = f"{kind} {operation}"
            self.injected[key] = self.injected.get(key, 0) + 1
            return kind

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": dict(self.requests),
                "faults": dict(self.injected),
                "plan": dict(self.plan),
            }


def _operation(method: str, path: str) -> str:
    """The kind of a GCS request, for counting and targeting faults."""
    route = path.split("?", 1)[0]
    query = path.partition("?")[2]
    if method == "DELETE":
        return "delete"
    if method in ("POST", "PUT", "PATCH"):
        return "write"
    if route.endswith("/o") or route.endswith("/b"):
        return "list"
    if (
        "alt=media" in query
        or route.startswith("/download/")
        or not route.startswith(("/storage/", "/b/"))
    ):
        return "read"
    return "stat"


def _read_head(reader) -> tuple[str, list[tuple[str, str]]] | None:
    line = reader.readline(65537)
    if not line:
        return None
    headers = []
    while True:
        header = reader.readline(65537)
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return line.decode("latin-1").rstrip("\r\n"), headers


def _read_body(reader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int(reader.readline().strip().split(b";")[0] or b"0", 16)
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(body)
            body += reader.read(size)
            reader.readline()
    length = int(headers.get("content-length") or 0)
    return reader.read(length) if length else b""


_HOP_BY_HOP = ("connection", "proxy-connection", "keep-alive", "transfer-encoding", "expect")


class _Front(socketserver.StreamRequestHandler):
    """One client connection: CONNECT (then TLS) for TensorFlow, plain HTTP for the others."""

    disable_nagle_algorithm = True

    def handle(self) -> None:
        connection, reader, secure_host = self.request, self.rfile, None
        try:
            while True:
                head = _read_head(reader)
                if head is None:
                    return
                line, header_list = head
                method, target, _ = line.split(" ", 2)
                headers = {k.lower(): v for k, v in header_list}
                if method == "CONNECT":
                    connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    connection = self.server.tls.wrap_socket(connection, server_side=True)
                    reader = connection.makefile("rb")
                    secure_host = target.rsplit(":", 1)[0]
                    continue
                if headers.get("expect", "").lower() == "100-continue":
                    connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = _read_body(reader, headers)
                if target.startswith(("http://", "https://")):
                    target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
                if target.startswith(ADMIN) and secure_host is None:
                    connection.sendall(self._admin(method, target, body))
                    continue
                fault = self.server.faults.draw(_operation(method, target))
                if fault in ("429", "503"):
                    connection.sendall(
                        _answer(int(fault), b'{"error": {"code": %s}}' % fault.encode())
                    )
                    continue
                if fault == "reset":
                    return _reset(connection)
                if fault == "stall":
                    time.sleep(float(self.server.faults.plan.get("stall_seconds", 5.0)))
                status, reason, answer_headers, data = self._forward(
                    method, target, header_list, body
                )
                if self.server.log is not None:
                    with self.server.log_lock:
                        self.server.log.write(f"{method} {target[:300]} -> {status}\n")
                        self.server.log.flush()
                if fault == "reset-after":
                    return _reset(connection)
                # The store writes links (a resumable upload's Location, an object's
                # mediaLink) with the Host its uploader used; each client gets them as its own.
                base = f"https://{secure_host}" if secure_host else f"http://{headers.get('host')}"
                kind = dict((k.lower(), v) for k, v in answer_headers).get("content-type", "")
                if kind.startswith("application/json") and _operation(method, target) != "read":
                    data = self._own_links(data, base)  # metadata, never an object's bytes
                out = [f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")]
                for name, value in answer_headers:
                    if name.lower() in _HOP_BY_HOP or name.lower() == "content-length":
                        continue
                    if name.lower() == "location":
                        value = self._own_links(value.encode("latin-1"), base).decode("latin-1")
                    out.append(f"{name}: {value}\r\n".encode("latin-1"))
                out.append(f"Content-Length: {len(data)}\r\n\r\n".encode("latin-1"))
                connection.sendall(b"".join(out) + (b"" if method == "HEAD" else data))
        except (ConnectionError, ssl.SSLError, OSError, ValueError):
            return

    def _own_links(self, data: bytes, base: str) -> bytes:
        for host in (*HOSTS, f"127.0.0.1:{self.server.server_address[1]}"):
            data = data.replace(f"http://{host}/".encode(), f"{base}/".encode())
        return data

    def _forward(self, method, target, header_list, body):
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.store_port, timeout=120)
        try:
            headers = {k: v for k, v in header_list if k.lower() not in _HOP_BY_HOP}
            headers = {k: v for k, v in headers.items() if k.lower() != "content-length"}
            headers["Content-Length"] = str(len(body))
            upstream.request(method, target, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            return answer.status, answer.reason, answer.getheaders(), data
        except (ConnectionError, http.client.HTTPException):
            # The store dropped the request (an error inside it): a server error, as GCS's.
            return 500, "Internal Server Error", [], b'{"error": {"code": 500}}'
        finally:
            upstream.close()

    def _admin(self, method: str, target: str, body: bytes) -> bytes:
        faults = self.server.faults
        if target.startswith(ADMIN + "faults") and method == "POST":
            faults.set(json.loads(body or b"{}"))
        elif target.startswith(ADMIN + "reset") and method == "POST":
            with faults.lock:
                faults.requests = dict.fromkeys(OPERATIONS, 0)
                faults.injected = {}
        return _answer(200, json.dumps(faults.stats()).encode(), "application/json")


def _answer(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    reason = http.client.responses.get(status, "")
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1") + body


def _reset(connection) -> None:
    """Closes the connection with a TCP reset (no answer at all)."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        connection.close()


class _FrontServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(
    directory: str, buckets: list[str], port: int = 0, on_ready=None, log: str | None = None
) -> None:
    """Runs the emulator and its front until killed; once both accept connections, calls
    `on_ready(port, authority_file)` (default: prints {"port", "ca"} as one JSON line)."""
    import logging

    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
    authority, host = _certificates(directory)
    server = _corrected_emulator()
    store = server.create_server("127.0.0.1", 0, in_memory=True)
    for bucket in buckets:
        from gcp_storage_emulator.handlers import buckets as bucket_handlers

        bucket_handlers.create_bucket(bucket, store._storage)
    store.start()
    front = _FrontServer(("127.0.0.1", port), _Front)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(host)
    front.tls = tls
    front.store_port = store._api._httpd.server_address[1]
    front.faults = _Faults()
    front.log = open(log, "a") if log else None  # each request and its status, for debugging
    front.log_lock = threading.Lock()
    if on_ready is None:
        print(json.dumps({"port": front.server_address[1], "ca": authority}), flush=True)
    else:
        on_ready(front.server_address[1], authority)
    front.serve_forever()


# -- the tests' side ----------------------------------------------------------------------------


def environment(port: int, authority: str) -> dict[str, str]:
    """The variables that send every GCS client of a process to the emulator on `port`."""
    front = f"http://127.0.0.1:{port}"
    return {
        "https_proxy": front,  # TensorFlow's libcurl: CONNECT through the front
        "HTTPS_PROXY": front,
        "no_proxy": "127.0.0.1,localhost",  # everything else local goes direct (gRPC, JAX)
        "NO_PROXY": "127.0.0.1,localhost",
        "CURL_CA_BUNDLE": authority,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "t2t-emulator",
        "NO_GCE_CHECK": "true",
        "TENSORSTORE_GCS_HTTP_URL": front,
        "STORAGE_EMULATOR_HOST": front,
    }


class Emulator:
    """The emulator in a child process, for a test or a harness.

    Attributes:
      port: the front's port on 127.0.0.1.
      env: the environment variables that point a process's GCS clients at it.
    """

    def __init__(self, buckets: list[str] = ("bucket",)):
        self.buckets = list(buckets)
        self._directory = tempfile.TemporaryDirectory(prefix="t2t-gcs-")
        self._process: subprocess.Popen | None = None
        self.port = 0
        self.env: dict[str, str] = {}

    def start(self) -> Emulator:
        command = [sys.executable, "-m", "t2t.testing.gcs_emulator", "--serve"]
        command += ["--directory", self._directory.name]
        for bucket in self.buckets:
            command += ["--bucket", bucket]
        clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        self._process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=clean
        )
        line = self._process.stdout.readline()  # blocks until it serves, or it died
        if not line:
            raise RuntimeError(f"The GCS emulator did not start (exit {self._process.wait()}).")
        ready = json.loads(line)
        self.port = ready["port"]
        self.env = environment(self.port, ready["ca"])
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process.stdout.close()
            self._process = None
        self._directory.cleanup()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _admin(self, path: str, payload: dict | None = None) -> dict[str, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            body = json.dumps(payload).encode() if payload is not None else None
            connection.request("POST" if body is not None else "GET", ADMIN + path, body=body)
            return json.loads(connection.getresponse().read())
        finally:
            connection.close()

    def set_faults(
        self,
        rate: float = 0.0,
        *,
        kinds: tuple[str, ...] = FAULTS,
        operations: tuple[str, ...] = OPERATIONS,
        seed: int = 0,
        stall_seconds: float = 5.0,
        limit: int | None = None,
    ) -> None:
        """From now on, each request of `operations` fails with probability `rate`, in one of
        `kinds` ("429", "503", "reset", "reset-after", "stall"); at most `limit` faults in
        all. `rate=0` turns faults off."""
        unknown = set(kinds) - set(FAULTS) | set(operations) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"Unknown fault kinds or operations: {sorted(unknown)}.")
        plan = {
            "rate": rate,
            "kinds": list(kinds),
            "operations": list(operations),
            "seed": seed,
            "stall_seconds": stall_seconds,
            "limit": limit,
        }
        self._admin("faults", plan if rate > 0 else {})

    def stats(self) -> dict[str, Any]:
        """{"requests": {operation: n}, "faults": {"<kind> <operation>": n}, "plan": {...}}."""
        return self._admin("stats")

    def reset_stats(self) -> None:
        self._admin("reset", {})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bucket", action="append", default=[], help="a bucket to create")
    parser.add_argument("--port", type=int, default=0, help="the front's port (0: any free one)")
    parser.add_argument("--directory", help="where the certificates go (default: a new one)")
    parser.add_argument("--log", help="append each request and its status to this file")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.directory, args.bucket, args.port, log=args.log)
        return
    buckets = args.bucket or ["bucket"]

    def announce(port: int, authority: str) -> None:
        print("# A GCS emulator on 127.0.0.1; in another shell, export:")
        for name, value in environment(port, authority).items():
            print(f"export {name}={value}")
        print("# Buckets:", ", ".join(f"gs://{b}" for b in buckets), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        directory = args.directory or tempfile.mkdtemp(prefix="t2t-gcs-")
        serve(directory, buckets, args.port, announce, log=args.log)


if __name__ == "__main__":
    main()
