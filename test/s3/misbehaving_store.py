"""A small S3 store of the tests' own that misbehaves on purpose (issue 58): the files of a local
directory served as objects of one bucket under a prefix (ListObjectsV2 with Key, Size and ETag;
GET with Range and If-Match), signatures ignored, each response framed as one `mode` says:

  good              a correct store (the control: a run against it trains)
  other-offset      a range answered by 206 with the bytes of another offset, and a truthful
                    Content-Range naming that other offset
  lying-end         a range answered by 206 with the bytes of another offset, under a
                    Content-Range that starts where asked but ends elsewhere
  first-bytes-200   a range at a non-zero offset answered by 200 with the object's first bytes,
                    exactly as many as asked
  no-etag           no ETag on GETs and If-Match ignored; the objects change after the listing
                    (each key serves the next file's bytes)
  total-mismatch    206 of the right bytes under a Content-Range whose total is not the size
  cut-once          the first 3 ranged GETs are cut halfway (headers say the full length)
  repeat-token      a listing whose continuation token is the same on every page
  backwards         a listing whose second page's keys come before the first page's
  etag-crlf         a listing whose ETag for the second object holds CR/LF and a header
  endless           a listing that never ends (new token and new key on every page)
  stall             GETs of objects never answered (until the store closes)
  dotdot            the objects' keys hold "../" (prefix sub/../); the raw request paths are
                    recorded, to check they are sent byte for byte

Used in-process by test_s3_hostile.py: Store(root, mode) serves on 127.0.0.1 in a thread until
close(); `requests` holds (method, raw path, headers) of every request."""
import hashlib
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

MODES = ("good", "other-offset", "lying-end", "first-bytes-200", "no-etag", "total-mismatch",
         "cut-once", "repeat-token", "backwards", "etag-crlf", "endless", "stall", "dotdot")
SHIFT = 4096  # how far "another offset" is from the one asked for


class Store:
    def __init__(self, root, mode="good", bucket="acts", prefix="p/"):
        assert mode in MODES, mode
        self.mode, self.bucket = mode, bucket
        if mode == "dotdot":
            prefix = prefix + "sub/../"
        self.prefix = prefix
        files = sorted(f for f in Path(root).iterdir() if f.is_file())
        # key -> bytes, read once: what the listing describes.
        self.objects = {prefix + f.name: f.read_bytes() for f in files}
        self.requests = []
        self.lock = threading.Lock()
        self.cuts = 0
        self.closing = threading.Event()
        store = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with store.lock:
                    store.requests.append(("GET", self.path, dict(self.headers)))
                store.get(self)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # the client hung up on a response it refused: expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def list_requests(self):
        with self.lock:
            return [r for r in self.requests if "list-type=2" in r[1]]

    def object_gets(self):
        with self.lock:
            return [r for r in self.requests if "list-type=2" not in r[1]]

    @staticmethod
    def etag(body):
        return '"' + hashlib.md5(body).hexdigest() + '"'

    # --- responses -------------------------------------------------------------------------

    def send(self, h, status, body, headers=()):
        h.send_response(status)
        for k, v in headers:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)

    def error(self, h, status, code, message):
        body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                f"<Message>{escape(message)}</Message></Error>").encode()
        self.send(h, status, body, [("Content-Type", "application/xml")])

    def get(self, h):
        url = urlsplit(h.path)
        if url.path.rstrip("/") == "/" + self.bucket and "list-type=2" in url.query:
            return self.list(h, parse_qs(url.query, keep_blank_values=True))
        if not url.path.startswith("/" + self.bucket + "/"):
            return self.error(h, 404, "NoSuchBucket", "no such bucket")
        key = unquote(url.path[len(self.bucket) + 2:])
        if key not in self.objects:
            return self.error(h, 404, "NoSuchKey", f"no such key {key}")
        body = self.objects[key]
        if self.mode == "stall":
            self.closing.wait(120)
            return
        if self.mode == "no-etag":  # changed after the listing: the next file's bytes
            keys = sorted(self.objects)
            body = self.objects[keys[(keys.index(key) + 1) % len(keys)]]
        etag = self.etag(self.objects[key])
        headers = [("Last-Modified", formatdate(usegmt=True))]
        if self.mode != "no-etag":
            headers.append(("ETag", etag))
            want = h.headers.get("If-Match")
            if want is not None and want.strip('"') != etag.strip('"'):
                return self.error(h, 412, "PreconditionFailed", "If-Match failed")
        rng = h.headers.get("Range")
        if rng is None:
            return self.send(h, 200, body, headers)
        first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
        size = len(body)
        last = min(last, size - 1)
        n = last - first + 1
        cr = f"bytes {first}-{last}/{size}"
        part = body[first:last + 1]
        if self.mode in ("other-offset", "lying-end"):
            other = first + SHIFT if last + SHIFT < size else first - SHIFT
            part = body[other:other + n]
            cr = (f"bytes {other}-{other + n - 1}/{size}" if self.mode == "other-offset"
                  else f"bytes {first}-{min(size - 1, last + SHIFT)}/{size}")
        elif self.mode == "first-bytes-200" and first > 0:
            return self.send(h, 200, body[:n], headers)
        elif self.mode == "total-mismatch":
            cr = f"bytes {first}-{last}/{size + 1000}"
        elif self.mode == "cut-once":
            with self.lock:
                cut = self.cuts < 3
                self.cuts += cut
            if cut:
                h.send_response(206)
                for k, v in headers + [("Content-Range", cr)]:
                    h.send_header(k, v)
                h.send_header("Content-Length", str(n))
                h.send_header("Connection", "close")
                h.end_headers()
                h.wfile.write(part[:n // 2])
                h.wfile.flush()
                h.close_connection = True
                return
        self.send(h, 206, part, headers + [("Content-Range", cr)])

    def list(self, h, q):
        prefix = q.get("prefix", [""])[0]
        delimiter = q.get("delimiter", [""])[0]
        token = q.get("continuation-token", [None])[0]
        max_keys = int(q.get("max-keys", ["1000"])[0])
        # The entries (keys, and common prefixes with a delimiter), in key order.
        entries = {}
        for key, body in self.objects.items():
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                cp = prefix + rest[:rest.index(delimiter) + 1]
                entries[cp] = None
            else:
                entries[key] = body
        names = sorted(entries)
        truncated, next_token = False, None
        if self.mode == "endless":
            n = int(token[1:]) if token else 0
            time.sleep(0.01)
            page = [(f"{prefix}zz-{n:09d}.txt", b"x")]
            truncated, next_token = True, f"t{n + 1}"
        elif self.mode == "repeat-token":
            i = 1 if token else 0
            page = [(k, entries[k]) for k in names[i:i + 1]]
            truncated, next_token = True, "same-token"
        elif self.mode == "backwards":
            if token is None:
                page = [(k, entries[k]) for k in names[-1:]]
                truncated, next_token = True, "back"
            else:
                page = [(k, entries[k]) for k in names[:-1]]
        else:
            start = names.index(token) + 1 if token in names else 0
            chosen = names[start:start + max_keys]
            page = [(k, entries[k]) for k in chosen]
            if start + max_keys < len(names):
                truncated, next_token = True, chosen[-1]
        parts = ["<?xml version='1.0' encoding='UTF-8'?>",
                 '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
                 f"<Name>{self.bucket}</Name><Prefix>{escape(prefix)}</Prefix>",
                 f"<KeyCount>{len(page)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
                 f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if next_token:
            parts.append(f"<NextContinuationToken>{escape(next_token)}</NextContinuationToken>")
        for i, (name, body) in enumerate(page):
            if body is None:
                parts.append(f"<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>")
                continue
            etag = escape(self.etag(body))
            if self.mode == "etag-crlf" and name.endswith("shard_00001.h5"):
                etag = etag[:-1] + "&#13;&#10;X-Injected: 1" + '"'
            parts.append(f"<Contents><Key>{escape(name)}</Key><Size>{len(body)}</Size>"
                         f"<ETag>{etag}</ETag><StorageClass>STANDARD</StorageClass></Contents>")
        parts.append("</ListBucketResult>")
        self.send(h, 200, "".join(parts).encode(), [("Content-Type", "application/xml")])
