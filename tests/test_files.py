"""files.atomic_write: the target is either the old one or the whole new one, and a failed write leaves nothing."""
import pytest

from roborl.files import atomic_write


def test_a_write_replaces_the_target_only_when_it_ends(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with atomic_write(target) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old"  # a reader sees the old file while the new one is written
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_failed_write_keeps_the_old_target_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_a_failed_write_removes_the_folders_it_made_and_keeps_those_that_were_there(tmp_path):
    with pytest.raises(RuntimeError), atomic_write(tmp_path / "runs" / "demo" / "demos.hdf5") as tmp:
        tmp.write_text("half")
        raise RuntimeError("no GL")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_written_whole_and_its_temporary_name_is_what_a_run_directory_sweeps(tmp_path):
    target = tmp_path / "exported"
    with atomic_write(target) as tmp:
        assert tmp.match(".*.tmp-*")  # run_dir.claim removes what a kill leaves under this pattern
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    assert (target / "config.json").read_text() == "{}"
    with pytest.raises(OSError), atomic_write(target) as tmp:  # a folder never replaces a non-empty one
        tmp.mkdir()
        (tmp / "config.json").write_text("other")
    assert (target / "config.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]
