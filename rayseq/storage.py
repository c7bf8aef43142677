"""Run directories on a local path or any pyarrow.fs URI (``file://``, ``s3://``, ``gs://``, ``hdfs://``).

Every output of a run (config, metrics, checkpoints, summary) goes through :class:`RunStore`, so a
local directory and ``s3://bucket/runs/x`` take the same code path. Writes are atomic: on a filesystem the data goes
to a temporary name in the same directory, then is renamed over the final name; an object store gets the object
directly (a PUT, or a multipart upload for a large one, is atomic by itself: readers never see a partial object, and
a move there would be a copy, which S3 refuses above 5 GiB). Large files are written as a stream
(:meth:`RunStore.write_file`), their SHA-256 computed on the way.
"""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def is_uri(location: str | os.PathLike) -> bool:
    return "://" in str(location)


def _s3_endpoint() -> dict:
    """An S3-compatible server other than AWS's, from the AWS SDKs' environment variables ``AWS_ENDPOINT_URL_S3`` or
    ``AWS_ENDPOINT_URL`` (``http://host:port``: MinIO, a local test server), as pyarrow's S3FileSystem options."""
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return {}
    scheme, _, host = url.partition("://")
    return {"endpoint_override": host.rstrip("/"), "scheme": scheme} if host else {"endpoint_override": url}


class RunStore:
    """A run directory: a local path or a pyarrow.fs URI (``s3://bucket/runs/x``; an S3-compatible server through
    ``AWS_ENDPOINT_URL``)."""

    def __init__(self, location: str | os.PathLike):
        location = str(location)
        if location.startswith("s3://") and "?" not in location and _s3_endpoint():
            self.fs, root = pafs.S3FileSystem(**_s3_endpoint()), location.removeprefix("s3://")
        elif is_uri(location):
            self.fs, root = pafs.FileSystem.from_uri(location)
        else:
            self.fs, root = pafs.LocalFileSystem(), str(Path(location).expanduser().absolute())
        self.root = root.rstrip("/") or "/"
        self.uri = location
        self.is_local = isinstance(self.fs, pafs.LocalFileSystem)

    def __repr__(self) -> str:
        return f"RunStore({self.uri!r})"

    @property
    def local_path(self) -> Path | None:
        """The directory as a local Path (None on a remote filesystem)."""
        return Path(self.root) if self.is_local else None

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    def display(self, *parts: str) -> str:
        """Human-readable location of ``parts`` (URI prefix kept for remote stores)."""
        if self.is_local and not is_uri(self.uri):
            return self.path(*parts)
        return "/".join([self.uri.rstrip("/"), *parts])

    # -- queries ----------------------------------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def listdir(self, *parts: str) -> list[str]:
        info = self.fs.get_file_info(self.path(*parts))
        if info.type != pafs.FileType.Directory:
            return []
        sel = pafs.FileSelector(self.path(*parts), recursive=False)
        return sorted(i.base_name for i in self.fs.get_file_info(sel))

    def is_empty(self) -> bool:
        return not self.listdir()

    # -- writes -----------------------------------------------------------------------------------
    def makedirs(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    @property
    def is_object_store(self) -> bool:
        """Objects rather than files (S3, GCS): no rename, and an upload is atomic by itself."""
        return type(self.fs).__name__ in ("S3FileSystem", "GcsFileSystem")

    def write_file(self, rel: str, write: Callable) -> tuple[str, int]:
        """Write ``rel`` atomically with ``write(stream)`` (the stream has ``write(bytes)``); returns its SHA-256 (hex)
        and size. A filesystem gets a temporary name then a rename; an object store the object itself."""
        final = self.path(rel)
        parent = final.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        target = final if self.is_object_store else f"{parent}/.{final.rsplit('/', 1)[1]}.tmp-{uuid.uuid4().hex[:8]}"
        with self.fs.open_output_stream(target) as f:
            out = _Hashing(f)
            write(out)
        if target != final:
            self.fs.move(target, final)
        return out.sha256.hexdigest(), out.size

    def write_bytes(self, rel: str, data: bytes) -> str:
        self.write_file(rel, lambda f: f.write(data))
        return self.path(rel)

    def write_text(self, rel: str, text: str) -> str:
        return self.write_bytes(rel, text.encode())

    def write_table(self, rel: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return self.write_bytes(rel, buf.getvalue())

    def delete(self, rel: str) -> None:
        """Delete the file (or the directory, with what it holds) ``rel``; nothing if it is not there."""
        kind = self.fs.get_file_info(self.path(rel)).type
        if kind == pafs.FileType.Directory:
            self.fs.delete_dir(self.path(rel))
        elif kind != pafs.FileType.NotFound:
            self.fs.delete_file(self.path(rel))

    def delete_dir(self, rel: str) -> None:
        """Delete the directory ``rel`` and what it holds (nothing if it is not there)."""
        try:
            self.fs.delete_dir(self.path(rel))
        except FileNotFoundError:
            pass

    def rename(self, rel: str, new_rel: str) -> None:
        self.fs.move(self.path(rel), self.path(new_rel))

    def upload_dir(self, local_dir: str | os.PathLike, rel: str) -> None:
        """Copy a local directory's files under ``rel`` (TensorBoard events for remote stores)."""
        local_dir = Path(local_dir)
        for f in local_dir.rglob("*"):
            if f.is_file():
                self.write_bytes(f"{rel}/{f.relative_to(local_dir).as_posix()}", f.read_bytes())

    # -- reads ------------------------------------------------------------------------------------
    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return f.read()

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def read_table(self, rel: str) -> pa.Table:
        return pq.read_table(io.BytesIO(self.read_bytes(rel)))


def copy_file(src: RunStore, src_rel: str, dst: RunStore, dst_rel: str, chunk: int = 1 << 24) -> str:
    """Copy the file ``src_rel`` of ``src`` to ``dst_rel`` of ``dst`` (local folders or object stores, in either
    direction) as a stream: at most ``chunk`` bytes of it in memory at a time, whatever its size (a checkpoint's
    shards). Written atomically (:meth:`RunStore.write_file`); returns its SHA-256."""

    def copy(out) -> None:
        with src.fs.open_input_stream(src.path(src_rel)) as f:
            while block := f.read(chunk):
                out.write(block)

    return dst.write_file(dst_rel, copy)[0]


class _Hashing:
    """A write-only stream that passes bytes on to ``stream`` and keeps their SHA-256 and count."""

    def __init__(self, stream):
        self.stream = stream
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        self.sha256.update(data)
        self.size += len(data)
        self.stream.write(data)
        return len(data)

    def flush(self) -> None:
        pass
