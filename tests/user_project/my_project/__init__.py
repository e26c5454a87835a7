"""A user's own project, outside trainkit: copied into a temporary directory by tests/test_user_project.py."""
