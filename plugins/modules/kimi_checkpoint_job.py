#!/usr/bin/python
"""Ansible module: the detached checkpoint download job on a node - started, watched until finished, stopped."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_checkpoint_job
short_description: Start the checkpoint download detached from Ansible, watch it until it ends, or stop it
description:
  - I(state=started) starts the download script detached from Ansible (a transient systemd unit, or a new
    session with nohup semantics) unless the job recorded in I(state_dir) is still running, in which case it
    attaches to it (C(attached)).
  - I(state=finished) reports the bytes on disk (finished files plus hf's partial files) and the job's state.
    Through the collection's action plugin of the same name it polls every I(interval) seconds, printing a
    progress line per poll, until the job ends or I(timeout) seconds passed, and stops the job when the bytes
    on disk did not grow for I(stall_timeout) seconds (C(stalled), C(stall_message)). One module run blocks on
    the node up to I(wait) seconds and answers as soon as the job ends.
  - I(state=stopped) stops the job (its process group, the script and hf; SIGTERM, then SIGKILL) and says why
    in a message naming the host, the bytes on disk and the seconds without progress.
options:
  state:
    description: What the job should be.
    type: str
    required: true
    choices: [started, finished, stopped]
  dir:
    description: The checkpoint directory.
    type: path
    required: true
  state_dir:
    description: Node-local directory of the job's pid, exit status and log.
    type: path
    required: true
  script:
    description: The download script (started runs it; the others recognise the job by its name).
    type: path
    required: true
  launcher:
    description: How the job is detached; auto is systemd where systemd runs, else a new session.
    type: str
    default: auto
    choices: [auto, systemd, nohup]
  unit:
    description: Transient systemd unit name.
    type: str
    default: kimi-checkpoint-download
  files:
    description: Files as kimi_hf_repo_files returns them, for the bytes on disk (finished, stopped).
    type: list
    elements: dict
    default: []
  host:
    description: Host name the progress and stall lines start with.
    type: str
    default: ""
  wait:
    description: finished - seconds one module run blocks on the node, returning at once when the job ends.
    type: float
    default: 0
  previous_time:
    description: finished - time of an earlier sample (for the rate).
    type: float
  previous_bytes:
    description: finished - bytes on disk at that sample.
    type: int
  interval:
    description: finished, action plugin - seconds between polls.
    type: float
    default: 30
  timeout:
    description: finished, action plugin - seconds it polls before it returns with the job still running; 0 = no limit.
    type: float
    default: 0
  stall_timeout:
    description: finished, action plugin - stop the job when the bytes on disk did not grow for this long; 0 = never.
    type: float
    default: 0
  stalled_seconds:
    description: stopped - seconds the download went without new bytes (for the message).
    type: float
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is started or stopped and no state file is written; the answer says what would be.
  diff_mode:
    support: none
    details: Its changes are a job started or stopped; the answer names them.
"""

EXAMPLES = r"""
- name: Start the download detached from this connection, or attach to the one running
  kimi_checkpoint_job:
    state: started
    dir: /data/models/kimi-k2.7-code
    state_dir: /var/lib/kimi-checkpoint
    script: /usr/local/libexec/kimi-checkpoint-download

- name: Report progress until the download ends
  kimi_checkpoint_job:
    state: finished
    dir: /data/models/kimi-k2.7-code
    state_dir: /var/lib/kimi-checkpoint
    script: /usr/local/libexec/kimi-checkpoint-download
    files: "{{ repo.files }}"
    interval: 30
    stall_timeout: 600
  register: checkpoint_wait
"""

RETURN = r"""
running:
  description: The job is alive.
  returned: always
  type: bool
pid:
  description: The job's pid (started, stopped); null when none.
  returned: when state is started or stopped
  type: int
attached:
  description: started found the job running and did not start another.
  returned: when state is started
  type: bool
bytes_on_disk:
  description: Finished plus partial bytes.
  returned: when state is finished or stopped
  type: int
total_bytes:
  description: Bytes of every listed file.
  returned: when state is finished or stopped
  type: int
line:
  description: The progress line (host, bytes, percentage, rate, ETA).
  returned: when state is finished
  type: str
exit_status:
  description: The job's exit status once it ended; null while running or unknown.
  returned: when state is finished
  type: int
log_tail:
  description: The log's last lines once the job ended.
  returned: when state is finished
  type: list
  elements: str
log_error:
  description: The log's last error line once the job ended; null if none.
  returned: when state is finished
  type: str
stalled:
  description: The action plugin stopped the job because the bytes on disk stopped growing.
  returned: when state is finished, through the action plugin
  type: bool
timed_out:
  description: The action plugin's I(timeout) passed with the job still running.
  returned: when state is finished, through the action plugin
  type: bool
stall_message:
  description: Why the job was stopped - host, seconds without new bytes, bytes on disk.
  returned: when state is stopped, or finished and stalled
  type: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint_node import (
    JobError,
    progress,
    repo_files,
    start_job,
    stop_stalled,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["started", "finished", "stopped"]},
            "dir": {"type": "path", "required": True},
            "state_dir": {"type": "path", "required": True},
            "script": {"type": "path", "required": True},
            "launcher": {"type": "str", "default": "auto", "choices": ["auto", "systemd", "nohup"]},
            "unit": {"type": "str", "default": "kimi-checkpoint-download"},
            "files": {"type": "list", "elements": "dict", "default": []},
            "host": {"type": "str", "default": ""},
            "wait": {"type": "float", "default": 0},
            "previous_time": {"type": "float"},
            "previous_bytes": {"type": "int"},
            "interval": {"type": "float", "default": 30},
            "timeout": {"type": "float", "default": 0},
            "stall_timeout": {"type": "float", "default": 0},
            "stalled_seconds": {"type": "float"},
        },
        supports_check_mode=True,
    )
    params = module.params
    directory, state_dir, script = Path(params["dir"]), Path(params["state_dir"]), params["script"]
    host = params["host"] or "node"
    files = repo_files(params["files"])
    if params["state"] == "started":
        try:
            result = start_job(state_dir, script, params["launcher"], params["unit"], check_mode=module.check_mode)
        except JobError as error:
            module.fail_json(msg=str(error))
        module.exit_json(**result)
    if params["state"] == "stopped":
        stalled = params["stalled_seconds"] or 0.0
        module.exit_json(
            **stop_stalled(
                directory, state_dir, files, script, host, stalled, params["stall_timeout"], module.check_mode
            )
        )
    previous = None
    if params["previous_time"] is not None and params["previous_bytes"] is not None:
        previous = (params["previous_time"], params["previous_bytes"])
    module.exit_json(changed=False, **progress(directory, state_dir, files, script, host, params["wait"], previous))


if __name__ == "__main__":
    main()
