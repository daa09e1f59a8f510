"""A test-only remote worker speaking BuildGrid's Remote Workers API (the Bots service).

BuildGrid's own worker (buildbox-worker) is not installable here, so this stands in for it.
What the tests rely on: each action runs in a fresh, empty directory holding only the input
root Bazel uploaded (the action's declared inputs), with only the Command's environment
variables plus RECURRENT_LOWERING_PYTHON_ENVS, the directory of pinned Python environments an
executor image would provide. An action that reads an undeclared file fails here.

  python3 remote_worker.py --server 127.0.0.1:PORT --envs DIR --workdir DIR --journal FILE

Each executed action appends one JSON line to the journal (its argv and exit code). It runs
with BuildGrid's Python environment (grpc and BuildGrid's generated REAPI/RWAPI stubs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import uuid

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from buildgrid._protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as re_grpc,
)
from buildgrid._protos.google.bytestream import bytestream_pb2, bytestream_pb2_grpc
from buildgrid._protos.google.devtools.remoteworkers.v1test2 import (
    bots_pb2,
    bots_pb2_grpc,
    worker_pb2,
)

BATCH_LIMIT = 1 << 20  # blobs up to this size go through Batch*Blobs, larger ones ByteStream


class Cas:
    def __init__(self, channel: grpc.Channel, instance: str):
        self.instance = instance
        self.cas = re_grpc.ContentAddressableStorageStub(channel)
        self.bytestream = bytestream_pb2_grpc.ByteStreamStub(channel)

    def read(self, digest: re_pb2.Digest) -> bytes:
        if digest.size_bytes == 0:
            return b""
        if digest.size_bytes <= BATCH_LIMIT:
            reply = self.cas.BatchReadBlobs(
                re_pb2.BatchReadBlobsRequest(instance_name=self.instance, digests=[digest])
            )
            (response,) = reply.responses
            if response.status.code != 0:
                raise RuntimeError(f"CAS read {digest.hash}: {response.status.message}")
            return response.data
        name = f"{self.instance}/blobs/{digest.hash}/{digest.size_bytes}".lstrip("/")
        request = bytestream_pb2.ReadRequest(resource_name=name)
        return b"".join(chunk.data for chunk in self.bytestream.Read(request))

    def write(self, data: bytes) -> re_pb2.Digest:
        digest = re_pb2.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))
        if len(data) <= BATCH_LIMIT:
            request = re_pb2.BatchUpdateBlobsRequest.Request(digest=digest, data=data)
            reply = self.cas.BatchUpdateBlobs(
                re_pb2.BatchUpdateBlobsRequest(instance_name=self.instance, requests=[request])
            )
            if reply.responses[0].status.code != 0:
                raise RuntimeError(f"CAS write: {reply.responses[0].status.message}")
            return digest
        name = f"{self.instance}/uploads/{uuid.uuid4()}/blobs/{digest.hash}/{len(data)}".lstrip("/")
        chunk = 1 << 20

        def requests():
            for offset in range(0, len(data), chunk):
                yield bytestream_pb2.WriteRequest(
                    resource_name=name if offset == 0 else "",
                    write_offset=offset,
                    finish_write=offset + chunk >= len(data),
                    data=data[offset : offset + chunk],
                )

        self.bytestream.Write(requests())
        return digest

    def message(self, digest: re_pb2.Digest, message_type):
        message = message_type()
        message.ParseFromString(self.read(digest))
        return message


def materialize(cas: Cas, digest: re_pb2.Digest, directory: pathlib.Path) -> None:
    """The input tree `digest` written under `directory` (files, subdirectories, symlinks)."""
    tree = cas.message(digest, re_pb2.Directory)
    directory.mkdir(parents=True, exist_ok=True)
    for node in tree.files:
        path = directory / node.name
        path.write_bytes(cas.read(node.digest))
        path.chmod(0o555 if node.is_executable else 0o444)
    for node in tree.symlinks:
        (directory / node.name).symlink_to(node.target)
    for node in tree.directories:
        materialize(cas, node.digest, directory / node.name)


def execute(cas: Cas, action: re_pb2.Action, root: pathlib.Path, envs: str) -> re_pb2.ActionResult:
    command = cas.message(action.command_digest, re_pb2.Command)
    shutil.rmtree(root, ignore_errors=True)
    materialize(cas, action.input_root_digest, root)
    cwd = root / command.working_directory
    outputs = list(command.output_files) + list(command.output_paths)
    for output in outputs:
        (cwd / output).parent.mkdir(parents=True, exist_ok=True)
    env = {v.name: v.value for v in command.environment_variables}
    env["RECURRENT_LOWERING_PYTHON_ENVS"] = envs
    done = subprocess.run(list(command.arguments), cwd=cwd, env=env, capture_output=True)
    result = re_pb2.ActionResult(
        exit_code=done.returncode,
        stdout_digest=cas.write(done.stdout),
        stderr_digest=cas.write(done.stderr),
    )
    for output in dict.fromkeys(outputs):
        path = cwd / output
        if path.is_file():
            result.output_files.add(
                path=output,
                digest=cas.write(path.read_bytes()),
                is_executable=os.access(path, os.X_OK),
            )
    return result


def serve(args) -> None:
    channel = grpc.insecure_channel(args.server)
    bots = bots_pb2_grpc.BotsStub(channel)
    cas = Cas(channel, args.instance)
    worker = worker_pb2.Worker(
        devices=[
            worker_pb2.Device(
                handle="test-worker",
                properties=[worker_pb2.Device.Property(key="OSFamily", value="Linux")],
            )
        ]
    )
    session = bots.CreateBotSession(
        bots_pb2.CreateBotSessionRequest(
            parent=args.instance,
            bot_session=bots_pb2.BotSession(
                bot_id=f"test-worker-{os.getpid()}", status=bots_pb2.OK, worker=worker
            ),
        ),
        timeout=10,
    )
    work = pathlib.Path(args.workdir)
    while True:
        for lease in session.leases:
            if lease.state == bots_pb2.LeaseState.PENDING:
                lease.state = bots_pb2.LeaseState.ACTIVE
            elif lease.state == bots_pb2.LeaseState.ACTIVE:
                action = re_pb2.Action()
                if not lease.payload.Unpack(action):
                    digest = re_pb2.Digest()
                    lease.payload.Unpack(digest)
                    action = cas.message(digest, re_pb2.Action)
                result = execute(cas, action, work / "exec", args.envs)
                command = cas.message(action.command_digest, re_pb2.Command)
                with open(args.journal, "a") as journal:
                    entry = {"argv": list(command.arguments), "exit_code": result.exit_code}
                    journal.write(json.dumps(entry) + "\n")
                lease.result.Pack(result)
                lease.status.code = 0
                lease.state = bots_pb2.LeaseState.COMPLETED
        session = bots.UpdateBotSession(
            bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session), timeout=10
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--instance", default="")
    parser.add_argument("--envs", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--journal", required=True)
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
