"""The checkpoint module split into the file (rundir/checkpoint_file.py) and the app's resume policy
(app/resume_policy.py): every old name of trainkit.rundir.checkpoint still works, the moved ones with a
DeprecationWarning naming where they live now."""
import pytest

import trainkit.rundir.checkpoint as old
from trainkit.app import resume_policy
from trainkit.rundir import checkpoint_file


@pytest.mark.parametrize("name", ["check_resumable", "restore", "RESUME_KEYS", "DATA_KEYS_FREE", "SCHEDULE_KEYS"])
def test_the_resume_policys_names_work_from_the_old_module_with_a_warning(name):
    with pytest.warns(DeprecationWarning, match=f"now trainkit.app.resume_policy.{name}; the old name is removed"):
        assert getattr(old, name) is getattr(resume_policy, name)


def test_the_saved_checkpoints_old_name_works_with_a_warning():
    with pytest.warns(DeprecationWarning, match="now trainkit.rundir.checkpoint_file.SavedCheckpoint"):
        assert old.TrainingCheckpoint is checkpoint_file.SavedCheckpoint


@pytest.mark.parametrize("name", ["Position", "save_training_checkpoint", "read_training_checkpoint", "find_checkpoint",
                                  "load_checkpoint_file", "checkpoint_files", "BEST", "APPENDED", "config_text"])
def test_the_files_names_are_the_old_modules_own(name, recwarn):
    assert getattr(old, name) is getattr(checkpoint_file, name)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
