"""``python -m my_project [key=value ...]``: trainkit's command with this project's configs (``../conf``).

The configs are found next to this package from any directory; ``conf/my_project.yaml`` makes the recipe
``lines`` the default, and ``python -m my_project --help`` lists the project's groups beside trainkit's.
"""
from trainkit.project import main

if __name__ == "__main__":
    main(config_path="../conf", config_name="my_project")
