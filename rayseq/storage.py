"""Run directories on a local path or any pyarrow.fs URI (``file://``, ``s3://``, ``gs://``, ``hdfs://``).

Every output of a run (config, metrics, checkpoints, summary) goes through :class:`RunStore`, so a
local directory and ``s3://bucket/runs/x`` take the same code path. Writes are atomic where the
filesystem allows it: data goes to a temporary name in the same directory, then is moved over the
final name (a rename on local disks; copy + delete on object stores, where readers never see a
partial object anyway).
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def is_uri(location: str | os.PathLike) -> bool:
    return "://" in str(location)


class RunStore:
    def __init__(self, location: str | os.PathLike):
        location = str(location)
        if is_uri(location):
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

    def write_bytes(self, rel: str, data: bytes) -> str:
        final = self.path(rel)
        parent = final.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.{final.rsplit('/', 1)[1]}.tmp-{uuid.uuid4().hex[:8]}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, final)
        return final

    def write_text(self, rel: str, text: str) -> str:
        return self.write_bytes(rel, text.encode())

    def write_table(self, rel: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return self.write_bytes(rel, buf.getvalue())

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.path(rel))
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
