#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: migration_info
short_description: The migrations of a host's migrator
description:
  - Reads the jobs of the migrator of one KVM host (C(GET /migrations)), all of them or the ones
    named C(name) or the one with C(id); changes nothing.
  - Poll it with C(until) to wait for a test boot's result, a bulk plan's state, ...
version_added: 0.1.0
author: VM migrator developers
extends_documentation_fragment:
  - migrator.kvm.connection
options:
  name:
    description: Only the jobs whose plan is named so (newest first).
    type: str
  id:
    description: Only the job with this id (a task fails with E_MIG_NOT_FOUND when there is none).
    type: str
'''

EXAMPLES = r'''
- name: Wait for the test boot's verdict
  migrator.kvm.migration_info:
    url: "{{ migrator_url }}"
    name: web01
  register: info
  until: info.job.test_boot.state in ['passed', 'failed', 'cancelled']
  retries: 60
  delay: 10

- name: Every job of the host
  migrator.kvm.migration_info:
    url: "{{ migrator_url }}"
  register: all_jobs
'''

RETURN = r'''
jobs:
  description: The jobs, newest first (docs/api.md "Job").
  returned: always
  type: list
  elements: dict
job:
  description: The newest of C(jobs), null when there is none.
  returned: always
  type: dict
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.migrator.kvm.plugins.module_utils.migrator import MigratorClient, migrator_argument_spec


def main():
    spec = migrator_argument_spec()
    spec.update(name=dict(type='str'), id=dict(type='str'))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True, mutually_exclusive=[('name', 'id')])
    client = MigratorClient(module)
    p = module.params
    if p['id']:
        jobs = [client.job(p['id'])]
    else:
        jobs = [j for j in client.jobs() if p['name'] is None or (j.get('plan') or {}).get('name') == p['name']]
    module.exit_json(changed=False, jobs=jobs, job=jobs[0] if jobs else None)


if __name__ == '__main__':
    main()
