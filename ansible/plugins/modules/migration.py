#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: migration
short_description: A migration (or a bulk plan) on a host's migrator, by plan name
description:
  - Submits a migration plan to the migrator of one KVM host (C(POST /migrations), or
    C(POST /plans) with C(bulk=true)), found again by its name; a second run finds the job (or
    bulk plan) named C(name) and submits nothing (C(changed=false)).
  - Then, in this order, each only when asked and only when not done already.
  - (1) Waits until the job can take a command (a copy is complete) when C(test_boot) or
    C(cutover) is asked together with C(wait).
  - (2) Asks for a test boot (C(test_boot), C(POST /migrations/{id}/test-boot)) unless the job
    has ended or its latest test boot is requested, running or passed.
  - (3) Asks for the cutover (C(cutover), C(POST /migrations/{id}/cutover), or the bulk plan's
    shared cutover) when the job waits in C(DeltaSyncing) and no cutover was asked yet.
  - (4) Waits until the job reached the state C(wait) (or a later one), failing when it ends
    C(Failed) or C(Cancelled) with its E_MIG_* code and message.
  - C(state=absent) cancels the job (every job of a bulk plan) that has not ended.
  - Check mode reports what would change and changes nothing.
version_added: 0.1.0
author: VM migrator developers
extends_documentation_fragment:
  - migrator.kvm.connection
options:
  name:
    description:
      - The plan's name (the job's C(plan.name), or the bulk plan's C(name)), what makes the task idempotent.
      - Set into C(plan) when it has none; a different C(name) in C(plan) is an error.
    type: str
    required: true
  plan:
    description:
      - The plan exactly as C(POST /migrations) takes it under C(plan) (docs/api.md "Plan"), or with
        C(bulk=true) the bulk plan as C(POST /plans) takes it (with C(vms), a list of C(key) and C(plan)).
      - Required when the job does not exist yet and C(state=present).
    type: dict
  bulk:
    description: C(plan) is a bulk plan (C(POST /plans)); the result has C(plan) and C(jobs).
    type: bool
    default: false
  state:
    description: C(present) submits when no job has the name; C(absent) cancels it if it has not ended.
    type: str
    choices: [present, absent]
    default: present
  wait:
    description:
      - A job state to wait for (C(CopyingFull), C(DeltaSyncing), C(CuttingOver), C(V2vProcessing),
        C(Starting), C(Completed), C(Failed), C(Cancelled)); a later state satisfies it (a cold job
        passes C(DeltaSyncing) without stopping there). With C(bulk=true), every job of the plan.
      - C(false) (the default) does not wait.
    type: str
    default: 'false'
  wait_timeout:
    description: Seconds C(wait) waits before the task fails.
    type: int
    default: 3600
  test_boot:
    description: Ask for a test boot of the copy (docs/test-boot.md); read its result with M(migrator.kvm.migration_info).
    type: bool
    default: false
  cutover:
    description: Ask a warm job (every warm job of a bulk plan) waiting in C(DeltaSyncing) to cut over now.
    type: bool
    default: false
'''

EXAMPLES = r'''
- name: Warm copy of web01, kept in sync until the cutover window
  migrator.kvm.migration:
    url: "{{ migrator_url }}"
    token: "{{ migrator_token }}"
    name: web01
    plan:
      source: {Live: vim_api}
      source_ref: {kind: live_vm, source_id: "{{ vc.id }}", vm_id: vm-1042}
      mode: Warm
      cutover: {mode: manual}
    wait: DeltaSyncing
    wait_timeout: 14400

- name: Test boot while the source runs
  migrator.kvm.migration:
    url: "{{ migrator_url }}"
    name: web01
    test_boot: true

- name: Cutover in the window, wait until it runs on KVM
  migrator.kvm.migration:
    url: "{{ migrator_url }}"
    name: web01
    cutover: true
    wait: Completed

- name: An offline import of an export in the import root
  migrator.kvm.migration:
    url: "{{ migrator_url }}"
    name: db02
    plan:
      source: {Offline: ova_archive}
      source_ref: {kind: offline_host_path, path: exports/db02.ova}
      mode: Cold
    wait: Completed

- name: Cancel it
  migrator.kvm.migration:
    url: "{{ migrator_url }}"
    name: db02
    state: absent
'''

RETURN = r'''
job:
  description: The job as C(GET /migrations/{id}) returns it (state, progress, last_error, cutover, test_boot, ...); null in check mode before it exists.
  returned: when not bulk
  type: dict
id:
  description: The job's id (the bulk plan's with C(bulk=true)); null in check mode before it exists.
  returned: always
  type: str
state:
  description: The job's state (the bulk plan's aggregate state with C(bulk=true)).
  returned: always
  type: str
plan:
  description: The bulk plan resource (C(GET /plans/{id})).
  returned: when bulk
  type: dict
jobs:
  description: The jobs of the bulk plan.
  returned: when bulk
  type: list
  elements: dict
submitted:
  description: Whether this run submitted the plan.
  returned: always
  type: bool
actions:
  description: What this run asked for (C(submit), C(test_boot), C(cutover), C(cancel)); in check mode, what it would.
  returned: always
  type: list
  elements: str
code:
  description: The E_MIG_* code of a failure.
  returned: failure
  type: str
'''

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.parse import quote
from ansible_collections.migrator.kvm.plugins.module_utils.migrator import JOB_ENDED, WAIT_STATES, MigratorClient, migrator_argument_spec, reached

TEST_BOOT_HELD = ('requested', 'running', 'passed')


def q(s):
    return quote(s, safe='')


def ready_for_commands(job):
    """Whether a copy is complete: a warm job waiting in DeltaSyncing, or one past it."""
    return job['state'] not in ('Queued', 'CopyingFull')


def single(module, client, p, wait):
    actions = []
    job = client.job_by_name(p['name'])
    if p['state'] == 'absent':
        if job is None or job['state'] in JOB_ENDED:
            module.exit_json(changed=False, job=job, id=job and job['id'], state=job and job['state'], submitted=False, actions=[])
        if not module.check_mode:
            job = client.call('POST', '/migrations/%s/cancel' % q(job['id']))
        module.exit_json(changed=True, job=job, id=job['id'], state=job['state'], submitted=False, actions=['cancel'])

    if job is None:
        plan = dict(p['plan'] or {})
        if not plan:
            module.fail_json(msg='no job is named %s and no plan was given to submit' % p['name'])
        if plan.get('name', p['name']) != p['name']:
            module.fail_json(msg='plan.name %s differs from name %s' % (plan.get('name'), p['name']))
        plan['name'] = p['name']
        actions.append('submit')
        if module.check_mode:
            module.exit_json(changed=True, job=None, id=None, state=None, submitted=True, actions=actions + (['test_boot'] if p['test_boot'] else []) + (['cutover'] if p['cutover'] else []))
        job = client.call('POST', '/migrations', {'plan': plan})

    if (p['test_boot'] or p['cutover']) and wait and not ready_for_commands(job):
        job = client.wait_job(job['id'], 'DeltaSyncing', p['wait_timeout'])
    if p['test_boot'] and (job.get('test_boot') or {}).get('state') not in TEST_BOOT_HELD and job['state'] not in JOB_ENDED:
        actions.append('test_boot')
        if not module.check_mode:
            job = client.call('POST', '/migrations/%s/test-boot' % q(job['id']))
    if p['cutover'] and job['state'] == 'DeltaSyncing' and not (job.get('cutover') or {}).get('requested_at'):
        actions.append('cutover')
        if not module.check_mode:
            job = client.call('POST', '/migrations/%s/cutover' % q(job['id']))
    if wait and not module.check_mode:
        job = client.wait_job(job['id'], wait, p['wait_timeout'])
    module.exit_json(changed=bool(actions), job=job, id=job['id'], state=job['state'], submitted='submit' in actions, actions=actions)


def bulk(module, client, p, wait):
    actions = []
    plan = client.bulk_plan_by_name(p['name'])
    if p['state'] == 'absent':
        live = [v for v in (plan or {}).get('vms', []) if v['state'] not in JOB_ENDED]
        if live and not module.check_mode:
            for v in live:
                client.call('POST', '/migrations/%s/cancel' % q(v['job_id']))
            plan = client.call('GET', '/plans/%s' % q(plan['id']))
        module.exit_json(changed=bool(live), plan=plan, jobs=[], id=plan and plan['id'], state=plan and plan['state'], submitted=False, actions=['cancel'] if live else [])
    if plan is None:
        body = dict(p['plan'] or {})
        if not body:
            module.fail_json(msg='no bulk plan is named %s and no plan was given to submit' % p['name'])
        if body.get('name', p['name']) != p['name']:
            module.fail_json(msg='plan.name %s differs from name %s' % (body.get('name'), p['name']))
        body['name'] = p['name']
        actions.append('submit')
        if module.check_mode:
            module.exit_json(changed=True, plan=None, jobs=[], id=None, state=None, submitted=True, actions=actions)
        plan = client.call('POST', '/plans', body)
    ids = [v['job_id'] for v in plan['vms']]
    if p['test_boot'] or p['cutover']:
        for job_id in ids:
            job = client.job(job_id)
            if wait and not ready_for_commands(job) and job['state'] not in JOB_ENDED:
                job = client.wait_job(job_id, 'DeltaSyncing', p['wait_timeout'])
            if p['test_boot'] and (job.get('test_boot') or {}).get('state') not in TEST_BOOT_HELD and job['state'] not in JOB_ENDED:
                actions.append('test_boot')
                if not module.check_mode:
                    client.call('POST', '/migrations/%s/test-boot' % q(job_id))
        plan = client.call('GET', '/plans/%s' % q(plan['id']))
        if p['cutover'] and plan['state'] == 'WaitingForCutover' and not plan.get('cutover_requested_at'):
            actions.append('cutover')
            if not module.check_mode:
                client.call('POST', '/plans/%s/cutover' % q(plan['id']))
    jobs = [client.wait_job(i, wait, p['wait_timeout']) if wait and not module.check_mode else client.job(i) for i in ids]
    plan = client.call('GET', '/plans/%s' % q(plan['id']))
    module.exit_json(changed=bool(actions), plan=plan, jobs=jobs, id=plan['id'], state=plan['state'], submitted='submit' in actions, actions=sorted(set(actions)))


def main():
    spec = migrator_argument_spec()
    spec.update(
        name=dict(type='str', required=True),
        plan=dict(type='dict'),
        bulk=dict(type='bool', default=False),
        state=dict(type='str', choices=['present', 'absent'], default='present'),
        wait=dict(type='str', default='false'),
        wait_timeout=dict(type='int', default=3600),
        test_boot=dict(type='bool', default=False),
        cutover=dict(type='bool', default=False),
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    wait = None if p['wait'] in ('false', 'False', 'no', '') else p['wait']
    if wait is not None and wait not in WAIT_STATES:
        module.fail_json(msg='wait %s is not a job state: one of %s, or false' % (wait, ', '.join(WAIT_STATES)))
    client = MigratorClient(module)
    if p['bulk']:
        bulk(module, client, p, wait)
    else:
        single(module, client, p, wait)


if __name__ == '__main__':
    main()
