"""Elastic data-parallel runtime: workers stay alive, only the process group is rebuilt.

- `core.runtime.elastic`: worker side, imported by training scripts (`elastic.init()`).
- `core.runtime.coordinator`: controller side (`JobCoordinator`, one per running job).
- `core.runtime.reports`: `ReportBook` / `ReportServer` for the workers' HTTP progress reports.
- `core.runtime.protocol`: store keys, environment variables and messages both sides share.

Nothing is imported here: a training script should pay only for `elastic` (torch), the
controller only for `coordinator`.
"""
