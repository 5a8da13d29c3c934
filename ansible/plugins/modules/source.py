#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: source
short_description: A live source or a remote credential of a host's migrator, present or absent by name
description:
  - Registers a live source (C(POST /sources), a vCenter or ESXi, ...) or a credential of remote
    inputs (C(POST /remote-credentials), HTTP basic or bearer, S3 keys, SMB) on the migrator of one
    KVM host, or removes it, found by C(name).
  - Idempotent by name. The server never returns a secret, so an existing one is left as it is;
    to change its secret, remove it (C(state=absent)) and add it again.
  - Secrets are C(no_log) and never in the result; keep them in Ansible Vault.
version_added: 0.1.0
author: VM migrator developers
extends_documentation_fragment:
  - migrator.kvm.connection
options:
  name:
    description: The source's or credential's name (unique per host).
    type: str
    required: true
  type:
    description: A live source (C(source)) or a credential of remote inputs (C(remote_credential)).
    type: str
    choices: [source, remote_credential]
    default: source
  state:
    description: C(present) registers it when no one of that name exists; C(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
  kind:
    description:
      - For a source, the adapter kind (C(vim_api), ...); for a credential, C(http_basic),
        C(http_bearer), C(s3) or C(smb). Required with C(state=present).
    type: str
  endpoint:
    description: The source's endpoint, e.g. C(https://vcenter.example/sdk).
    type: str
  username:
    description: The user name (a source, an C(http_basic) or C(smb) credential).
    type: str
  password:
    description: The password (a source, an C(http_basic) or C(smb) credential).
    type: str
  bearer_token:
    description: The token of an C(http_bearer) credential.
    type: str
  access_key_id:
    description: The access key id of an C(s3) credential.
    type: str
  secret_access_key:
    description: The secret access key of an C(s3) credential.
    type: str
  domain:
    description: The domain of an C(smb) credential.
    type: str
  tls:
    description: The source's TLS settings as C(POST /sources) takes them (docs/api.md), for example with C(thumbprint).
    type: dict
'''

EXAMPLES = r'''
- name: The vCenter of wave 1 on this host
  migrator.kvm.source:
    url: "{{ migrator_url }}"
    token: "{{ migrator_token }}"
    name: vc-east
    kind: vim_api
    endpoint: https://vcenter.example/sdk
    username: migrate@vsphere.local
    password: "{{ vault_vcenter_password }}"

- name: The web server holding the exports
  migrator.kvm.source:
    url: "{{ migrator_url }}"
    type: remote_credential
    name: exports
    kind: http_bearer
    bearer_token: "{{ vault_exports_token }}"

- name: Gone after the migration
  migrator.kvm.source:
    url: "{{ migrator_url }}"
    name: vc-east
    state: absent
'''

RETURN = r'''
source:
  description: The source or credential as the API returns it (never its secret); null once absent or when check mode would create it.
  returned: always
  type: dict
  sample: {id: 0b6f3b0e-6f0e-4c5e-9d0b-6a3c2f1d9e11, name: vc-east, kind: vim_api, endpoint: "https://vcenter.example/sdk"}
id:
  description: Its id (null when absent).
  returned: always
  type: str
code:
  description: The E_MIG_* code of a failure.
  returned: failure
  type: str
'''

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.parse import quote
from ansible_collections.migrator.kvm.plugins.module_utils.migrator import MigratorClient, migrator_argument_spec

SECRET_FIELDS = {'http_basic': ['username', 'password'], 'smb': ['username', 'password', 'domain'], 'http_bearer': ['bearer_token'], 's3': ['access_key_id', 'secret_access_key']}


def body_of(p):
    """The POST body of the source or credential the options describe."""
    if p['type'] == 'source':
        body = dict(name=p['name'], kind=p['kind'], endpoint=p['endpoint'], username=p['username'], password=p['password'])
        if p['tls'] is not None:
            body['tls'] = p['tls']
        return body
    body = dict(name=p['name'], kind=p['kind'])
    for field in SECRET_FIELDS.get(p['kind'], []):
        if p[field] is not None:
            body['token' if field == 'bearer_token' else field] = p[field]
    return body


def main():
    spec = migrator_argument_spec()
    spec.update(
        name=dict(type='str', required=True),
        type=dict(type='str', choices=['source', 'remote_credential'], default='source'),
        state=dict(type='str', choices=['present', 'absent'], default='present'),
        kind=dict(type='str'),
        endpoint=dict(type='str'),
        username=dict(type='str'),
        password=dict(type='str', no_log=True),
        bearer_token=dict(type='str', no_log=True),
        access_key_id=dict(type='str'),
        secret_access_key=dict(type='str', no_log=True),
        domain=dict(type='str'),
        tls=dict(type='dict'),
    )
    module = AnsibleModule(
        argument_spec=spec,
        supports_check_mode=True,
        required_if=[('state', 'present', ['kind'])],
    )
    p = module.params
    client = MigratorClient(module)
    collection = '/sources' if p['type'] == 'source' else '/remote-credentials'
    if p['type'] == 'source' and p['state'] == 'present':
        missing = [o for o in ('endpoint', 'username', 'password') if not p[o]]
        if missing:
            module.fail_json(msg='a source needs %s' % ', '.join(missing))
    existing = next((s for s in client.call('GET', collection)['items'] if s.get('name') == p['name']), None)

    if p['state'] == 'absent':
        if existing is None:
            module.exit_json(changed=False, source=None, id=None)
        if not module.check_mode:
            client.call('DELETE', '%s/%s' % (collection, quote(existing['id'], safe='')))
        module.exit_json(changed=True, source=None, id=existing['id'])

    if existing is not None:
        if existing.get('kind') != p['kind']:
            module.fail_json(msg='%s %s exists with kind %s, not %s: remove it first (state: absent)' % (p['type'], p['name'], existing.get('kind'), p['kind']), source=existing)
        module.exit_json(changed=False, source=existing, id=existing['id'])
    if module.check_mode:
        module.exit_json(changed=True, source=None, id=None)
    created = client.call('POST', collection, body_of(p))
    module.exit_json(changed=True, source=created, id=created['id'])


if __name__ == '__main__':
    main()
