"""airgraph/trust.py: which folders airgraph may load code from (issue #51). Tests run as root, so a file of another
user is made with ``os.chown``; the current user's own files are checked too."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from airgraph import trust
from airgraph.config import CompilerConfig

OTHER_UID = 4242 if os.geteuid() != 4242 else 4243


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A folder of this user's, mode 0700, under pytest's private temporary folder."""
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    return folder


def test_a_private_folder_and_its_file_are_safe(private):
    (private / "entry").write_bytes(b"x")
    os.chmod(private / "entry", 0o644)
    assert trust.problem(private / "entry") is None
    assert trust.problem(private / "not-yet" / "deeper") is None  # judged by the folders that exist


@pytest.mark.parametrize("mode, who", [(0o770, "its group"), (0o757, "others"), (0o777, "its group and others")])
def test_a_folder_others_can_write_is_refused_with_the_fix(private, mode, who):
    os.chmod(private, mode)
    reason = trust.problem(private / "entry")
    assert reason is not None and f"folder {private} is writable by {who} (mode {mode:04o})" in reason
    assert f"chmod go-w {private}" in reason and "config.trusted_folders" in reason
    with pytest.raises(trust.Untrusted, match="writable by"):
        trust.check(private / "entry")


def test_a_group_writable_file_is_refused(private):
    entry = private / "entry"
    entry.write_bytes(b"x")
    os.chmod(entry, 0o664)
    assert f"file {entry} is writable by its group (mode 0664)" in trust.problem(entry)


def test_a_file_or_folder_of_another_user_is_refused(private):
    entry = private / "entry"
    entry.write_bytes(b"x")
    os.chown(entry, OTHER_UID, -1)
    reason = trust.problem(entry)
    assert reason is not None and f"file {entry} is owned by uid {OTHER_UID}" in reason
    assert f"not by you (uid {os.geteuid()}" in reason
    os.chown(entry, os.geteuid(), -1)
    assert trust.problem(entry) is None
    os.chown(private, OTHER_UID, -1)
    assert f"folder {private} is owned by uid {OTHER_UID}" in trust.problem(entry)


def test_a_loose_parent_above_the_store_is_refused(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    (parent / "store").mkdir(mode=0o700)
    os.chmod(parent, 0o777)  # anyone can rename store away and put their own in its place
    assert f"folder {parent} is writable by its group and others" in trust.problem(parent / "store" / "entry")


def test_a_sticky_world_writable_parent_is_safe(tmp_path):
    sticky = tmp_path / "tmp-like"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # like /tmp: others cannot remove or rename what is ours
    (sticky / "mine").mkdir(mode=0o755)
    assert trust.problem(sticky / "mine" / "entry") is None
    os.chown(sticky / "mine", OTHER_UID, -1)  # a folder another user made in it is still refused
    assert "owned by uid" in trust.problem(sticky / "mine" / "entry")


def test_a_symbolic_link_is_judged_where_it_leads(private, tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    (private / "link").symlink_to(loose)
    assert f"folder {loose} is writable" in trust.problem(private / "link" / "entry")


def test_a_trusted_folder_and_what_is_inside_it_are_not_checked(private):
    os.chmod(private, 0o777)
    os.chown(private, OTHER_UID, -1)
    assert trust.problem(private / "a" / "entry", trusted=[str(private)]) is None
    assert trust.problem(private, trusted=[str(private)]) is None
    assert trust.problem(private / "entry", trusted=[str(private / "a")]) is not None  # a folder inside: not its parent
    assert trust.describe(private, [str(private)]).verdict() == "trusted (config.trusted_folders)"
    facts = trust.describe(private)
    assert facts.owner == f"uid {OTHER_UID}" and facts.mode == "0777" and facts.verdict().startswith("REFUSED: ")


def test_make_folder_creates_folders_nobody_else_can_write(private):
    old = os.umask(0)
    try:
        made = trust.make_folder(private / "a" / "b")
        shared = trust.make_folder(private / "team" / "c", trusted=[str(private / "team")])
    finally:
        os.umask(old)
    for folder in (private / "a", made):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE(shared.stat().st_mode) == 0o777  # a trusted folder is shared on purpose
    assert trust.problem(made / "entry") is None


def test_trusted_folders_option_from_code_and_the_environment(monkeypatch, tmp_path):
    config = CompilerConfig()
    assert config.trusted_folders == ()
    config.trusted_folders = [str(tmp_path / "a"), "~/team"]
    assert config.trusted_folders == (str(tmp_path / "a"), os.path.expanduser("~/team"))
    monkeypatch.setenv("AIRGRAPH_TRUSTED_FOLDERS", f"{tmp_path}/x{os.pathsep}{tmp_path}/y")
    assert CompilerConfig().trusted_folders == (f"{tmp_path}/x", f"{tmp_path}/y")
    for bad, why in [("*", "would trust everything"), ("/", "would trust everything"), ("rel/dir", "not an absolute")]:
        with pytest.raises(ValueError, match=f"trusted_folders: invalid value .*{why}"):
            config.trusted_folders = [bad]
    with pytest.raises(ValueError, match="trusted_folders: invalid value"):
        config.trusted_folders = 3
