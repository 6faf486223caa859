"""Checkpoint verification: torch zips, safetensors and DCP folders are read back; corrupt, truncated
and missing ones fail with the reason; the reporter verifies every completed local checkpoint."""

from __future__ import annotations

import json
import struct
import threading
import zipfile
from pathlib import Path

from producers.publisher import MemoryPublisher
from producers.training import Reporter
from producers.training.verify import CheckpointVerifier, Verification, verify_path


def _torch_zip(path: Path, payload: bytes = b"\x80\x02}q\x00." + b"t" * 5000) -> Path:
    with zipfile.ZipFile(path, "w") as zf:  # the layout torch.save writes
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/data/0", b"\x00" * 4096)
        zf.writestr("archive/version", b"3\n")
    return path


def _safetensors(path: Path, tensors: int = 2, extra: bytes = b"") -> Path:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    for i in range(tensors):
        header[f"w{i}"] = {"dtype": "F32", "shape": [4], "data_offsets": [16 * i, 16 * (i + 1)]}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x01" * (16 * tensors) + extra)
    return path


def test_a_torch_zip_is_verified_with_a_stable_checksum(tmp_path: Path) -> None:
    ck = _torch_zip(tmp_path / "model.pt")
    first, second = verify_path(ck), verify_path(ck)
    assert first.ok and first.checksum and first.checksum.startswith("sha256:")
    assert first.checksum == second.checksum and first.bytes == ck.stat().st_size
    assert first.formats == {"torch_zip": 1}


def test_a_truncated_torch_zip_fails(tmp_path: Path) -> None:
    ck = _torch_zip(tmp_path / "model.pt")
    data = ck.read_bytes()
    ck.write_bytes(data[: len(data) // 2])
    result = verify_path(ck)
    assert (
        not result.ok
        and "model.pt" in (result.error or "")
        and "truncated or corrupt" in (result.error or "")
    )


def test_a_flipped_byte_inside_a_torch_zip_fails_its_crc(tmp_path: Path) -> None:
    ck = _torch_zip(tmp_path / "model.pt")
    data = bytearray(ck.read_bytes())
    at = data.index(b"t" * 100) + 50
    data[at] ^= 0xFF
    ck.write_bytes(bytes(data))
    result = verify_path(ck)
    assert not result.ok and "CRC" in (result.error or "")


def test_a_pt_file_that_is_not_a_zip_fails(tmp_path: Path) -> None:
    (tmp_path / "x.ckpt").write_bytes(b"garbage" * 100)
    result = verify_path(tmp_path / "x.ckpt")
    assert not result.ok and "not a torch zip" in (result.error or "")


def test_missing_and_empty_checkpoints_fail(tmp_path: Path) -> None:
    missing = verify_path(tmp_path / "gone.pt")
    assert not missing.ok and "does not exist" in (missing.error or "")
    (tmp_path / "empty").mkdir()
    assert "holds no files" in (verify_path(tmp_path / "empty").error or "")
    (tmp_path / "zero.bin").write_bytes(b"")
    assert "is empty" in (verify_path(tmp_path / "zero.bin").error or "")


def test_a_hugging_face_folder_with_safetensors_is_verified_and_a_truncated_one_fails(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    _safetensors(folder / "model.safetensors")
    _torch_zip(folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text('{"global_step": 10}')
    ok = verify_path(folder)
    assert ok.ok and ok.files == 3 and ok.formats == {"safetensors": 1, "torch_zip": 1, "other": 1}
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-5])
    bad = verify_path(folder)
    assert not bad.ok and "model.safetensors" in (bad.error or "") and "truncated" in (bad.error or "")


def test_safetensors_with_trailing_bytes_or_a_bad_header_fails(tmp_path: Path) -> None:
    assert not verify_path(_safetensors(tmp_path / "a.safetensors", extra=b"xx")).ok
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope" + b"\x00" * 8)
    assert "not valid JSON" in (verify_path(tmp_path / "b.safetensors").error or "")


def test_a_dcp_folder_needs_its_metadata(tmp_path: Path) -> None:
    folder = tmp_path / "dcp"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"s" * 100)
    (folder / "__1_0.distcp").write_bytes(b"s" * 100)
    assert "no .metadata" in (verify_path(folder).error or "")
    (folder / ".metadata").write_bytes(b"m" * 10)
    result = verify_path(folder)
    assert result.ok and result.formats == {"dcp": 3}


def test_the_checksum_changes_when_any_file_changes(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "a.json").write_text("1")
    before = verify_path(folder).checksum
    (folder / "a.json").write_text("2")
    assert verify_path(folder).checksum != before


def test_the_verifier_runs_off_the_calling_thread_and_survives_a_failing_check(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    calls = 0

    def check(path: str) -> Verification:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return verify_path(path)

    verifier = CheckpointVerifier(check)
    ck = _torch_zip(tmp_path / "m.pt")
    verifier.submit(ck, lambda r: seen.append((threading.current_thread().name, str(r.ok))))
    verifier.submit(ck, lambda r: seen.append((threading.current_thread().name, str(r.ok))))
    assert verifier.wait(10)
    verifier.close(10)
    assert seen == [("ranksight-verify", "False"), ("ranksight-verify", "True")]


def test_the_reporter_verifies_torch_save_checkpoints_by_default(tmp_path: Path) -> None:
    publisher = MemoryPublisher()
    reporter = Reporter("vjob", 0, node="n", publisher=publisher, bind=False, env={}, timing="host")
    good, bad = tmp_path / "s1.pt", tmp_path / "s2.pt"
    with reporter.checkpoint(1, f"file://{good}"):
        _torch_zip(good)
    with reporter.checkpoint(2, str(bad)):
        bad.write_bytes(b"PK\x03\x04 not really")
    with reporter.checkpoint(3, "s3://bucket/ck"):  # remote: not read back here
        pass
    reporter.close()
    phases = [(e.record["step"], e.record["phase"]) for e in publisher.events if e.type == "CheckpointEvent"]
    assert (1, "verified") in phases and (2, "verify_failed") in phases
    assert [p for s, p in phases if s == 3] == ["started", "completed"]
    [failed] = [
        e.record
        for e in publisher.events
        if e.type == "CheckpointEvent" and e.record["phase"] == "verify_failed"
    ]
    assert "s2.pt" in failed["error"]


def test_verification_can_be_turned_off(tmp_path: Path) -> None:
    publisher = MemoryPublisher()
    reporter = Reporter(
        "vjob",
        0,
        node="n",
        publisher=publisher,
        bind=False,
        env={"RANKSIGHT_VERIFY_CHECKPOINTS": "0"},
        timing="host",
    )
    with reporter.checkpoint(1, str(_torch_zip(tmp_path / "a.pt"))):
        pass
    reporter.close()
    assert [e.record["phase"] for e in publisher.events if e.type == "CheckpointEvent"] == [
        "started",
        "completed",
    ]
