"""Elastic data-parallel runtime: workers stay alive, only the process group is rebuilt.

- `core.runtime.elastic`: worker side, imported by training scripts (`elastic.init()`), with
  `checkpoint` (checkpoint files), `background` (store connections, watch / heartbeat / report
  threads), `group` (state sync, DDP wrapper) and `sampling` (which samples each rank takes).
- `core.runtime.coordinator`: controller side (`JobCoordinator`, one per running job): serves the
  job's TCPStore and executes what `core.runtime.regroup` (the membership rules, no I/O) decides.
- `core.runtime.reports`: `ReportBook` / `ReportServer` for the workers' HTTP progress reports.
- `core.runtime.protocol`: store keys, environment variables and messages both sides share.
- `core.runtime.signing`: the store as both sides use it: keys under a namespace and values under
  an HMAC, both from the per-job secret, so a non-member's writes are never read.

Nothing is imported here: a training script should pay only for `elastic` (torch), the
controller only for `coordinator`.
"""
