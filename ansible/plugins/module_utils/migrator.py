# -*- coding: utf-8 -*-
"""Shared code of the migrator.kvm modules: the connection options and a client of the
migrator's HTTP API (docs/api.md) over ansible.module_utils.urls.open_url.

Every error the API answers is ``{"error": {"code": "E_MIG_...", "message": ..., "details": ...}}``;
the client fails the module with that code and message (``code``, ``msg``, ``status``,
``details`` in the result). Secrets (``token``, ``url_password``) are ``no_log``.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import time

from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.six.moves.urllib.parse import quote
from ansible.module_utils.urls import open_url

# The job states in the order a job moves through them (lib/job.ts JOB_STATES); Failed and
# Cancelled end a job wherever it was.
JOB_ORDER = ['Queued', 'CopyingFull', 'DeltaSyncing', 'CuttingOver', 'V2vProcessing', 'Starting', 'Completed']
JOB_ENDED = ['Completed', 'Failed', 'Cancelled']
WAIT_STATES = JOB_ORDER[1:] + ['Failed', 'Cancelled']


def migrator_argument_spec():
    """The options every module takes: where the host's migrator is and how to reach it."""
    return dict(
        url=dict(type='str', required=True),
        token=dict(type='str', no_log=True),
        url_username=dict(type='str'),
        url_password=dict(type='str', no_log=True),
        unix_socket=dict(type='path'),
        validate_certs=dict(type='bool', default=True),
        ca_path=dict(type='path'),
        timeout=dict(type='int', default=30),
    )


class MigratorClient(object):
    """Calls the API at the module's ``url``; every failure fails the module."""

    def __init__(self, module):
        self.module = module
        self.base = module.params['url'].rstrip('/')

    def fail(self, msg, code=None, status=None, details=None, **extra):
        """Fails the module with ``code: message`` and the code, status and details apart."""
        self.module.fail_json(msg='%s: %s' % (code, msg) if code else msg, code=code, status=status, details=details, **extra)

    def call(self, method, path, body=None, ok_missing=False):
        """``method path`` under the base URL with a JSON body; returns the decoded answer
        (None for 204, or for 404 when ``ok_missing``)."""
        p = self.module.params
        headers = {'Accept': 'application/json'}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers['Content-Type'] = 'application/json'
        if p.get('token'):
            headers['Authorization'] = 'Bearer %s' % p['token']
        try:
            resp = open_url(
                self.base + path,
                data=data,
                headers=headers,
                method=method,
                url_username=p.get('url_username'),
                url_password=p.get('url_password'),
                force_basic_auth=bool(p.get('url_username')),
                validate_certs=p['validate_certs'],
                ca_path=p.get('ca_path'),
                unix_socket=p.get('unix_socket'),
                timeout=p['timeout'],
                http_agent='ansible-migrator.kvm',
            )
            text = resp.read()
            return json.loads(text) if text else None
        except HTTPError as e:
            raw = e.read() if hasattr(e, 'read') else b''
            try:
                err = json.loads(raw)['error']
            except Exception:
                err = {'code': None, 'message': raw.decode('utf-8', 'replace')[:500] or str(e)}
            if e.code == 404 and ok_missing:
                return None
            self.fail(err.get('message'), code=err.get('code'), status=e.code, details=err.get('details'), request='%s %s' % (method, path))
        except URLError as e:
            self.fail('cannot reach the migrator at %s: %s; check url (and unix_socket), that the server runs, and the TLS options' % (self.base, e.reason))
        except Exception as e:  # socket timeouts, TLS errors outside URLError
            self.fail('request %s %s to %s failed: %s' % (method, path, self.base, e))

    def jobs(self):
        """Every job, newest first."""
        return self.call('GET', '/migrations')['items']

    def job(self, job_id):
        return self.call('GET', '/migrations/%s' % quote(job_id, safe=''))

    def job_by_name(self, name):
        """The newest job whose plan is named ``name``, or None."""
        for j in self.jobs():
            if (j.get('plan') or {}).get('name') == name:
                return j
        return None

    def bulk_plan_by_name(self, name):
        """The newest bulk plan named ``name``, or None."""
        plans = self.call('GET', '/plans')['items']
        found = [b for b in plans if b.get('name') == name]
        return found[0] if found else None

    def wait_job(self, job_id, state, timeout):
        """Polls the job until it reached ``state`` (or a later one); fails when it ended
        elsewhere (with its last_error code and message) or after ``timeout`` seconds."""
        deadline = time.time() + timeout
        while True:
            job = self.job(job_id)
            if reached(job, state):
                return job
            if job['state'] in ('Failed', 'Cancelled'):
                err = job.get('last_error') or {}
                self.fail('job %s ended %s before %s: %s' % (job_id, job['state'], state, err.get('message')), code=err.get('code'), job=job)
            if time.time() >= deadline:
                self.fail('job %s is %s after %s s, not yet %s; raise wait_timeout or look at the job' % (job_id, job['state'], timeout, state), job=job)
            time.sleep(1)


def reached(job, state):
    """Whether ``job`` is in ``state`` or past it (a cold job passes DeltaSyncing without it)."""
    s = job['state']
    if state in ('Failed', 'Cancelled') or s in ('Failed', 'Cancelled'):
        return s == state
    return JOB_ORDER.index(s) >= JOB_ORDER.index(state)
