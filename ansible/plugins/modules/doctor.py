#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: doctor
short_description: The pre-flight checks of a host's migrator
description:
  - Runs the host's pre-flight checks (C(GET /doctor), as C(migrator doctor)) - libvirt, the
    destination pool, bridges, tools, space, ...; changes nothing.
  - Fails the task when a check's status is as bad as C(fail_on) or worse, listing those checks with their fix.
version_added: 0.1.0
author: VM migrator developers
extends_documentation_fragment:
  - migrator.kvm.connection
options:
  fail_on:
    description: C(fail) fails on a failing check, C(warn) on a warning too, C(never) only reports.
    type: str
    choices: [fail, warn, never]
    default: fail
'''

EXAMPLES = r'''
- name: The host is fit to take migrations
  migrator.kvm.doctor:
    url: "{{ migrator_url }}"
    token: "{{ migrator_token }}"
'''

RETURN = r'''
status:
  description: The worst check's status, C(ok), C(warn) or C(fail).
  returned: always
  type: str
checks:
  description: Every check, C({id, status, found, fix}).
  returned: always
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.migrator.kvm.plugins.module_utils.migrator import MigratorClient, migrator_argument_spec

RANK = {'ok': 0, 'warn': 1, 'fail': 2}


def main():
    spec = migrator_argument_spec()
    spec.update(fail_on=dict(type='str', choices=['fail', 'warn', 'never'], default='fail'))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    report = MigratorClient(module).call('GET', '/doctor')
    limit = module.params['fail_on']
    bad = [c for c in report['checks'] if limit != 'never' and RANK.get(c['status'], 2) >= RANK[limit]]
    if bad:
        module.fail_json(
            msg='pre-flight checks not passed: %s' % '; '.join('%s (%s): %s; fix: %s' % (c['id'], c['status'], c.get('found'), c.get('fix')) for c in bad),
            status=report['status'],
            checks=report['checks'],
        )
    module.exit_json(changed=False, status=report['status'], checks=report['checks'])


if __name__ == '__main__':
    main()
