# -*- coding: utf-8 -*-
"""The connection options every migrator.kvm module takes (module_utils/migrator.py)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r'''
options:
  url:
    description:
      - The base URL of the host's migrator API, e.g. C(http://127.0.0.1:8080/api/v1/migrator),
        or the host daemon's URL it is mounted under.
      - With C(unix_socket), the host part is ignored (C(http://localhost/api/v1/migrator)).
    type: str
    required: true
  token:
    description:
      - "A token sent as C(Authorization: Bearer <token>) (the server's C(<dataDir>/api-token) or the host daemon's)."
    type: str
  url_username:
    description: User name of HTTP Basic authentication (C(MIGRATOR_BASIC_AUTH) or the host daemon's).
    type: str
  url_password:
    description: Password of HTTP Basic authentication.
    type: str
  unix_socket:
    description: A unix socket the migrator (or the host daemon) listens on, instead of TCP.
    type: path
  validate_certs:
    description: Whether to verify the server's TLS certificate (https URLs).
    type: bool
    default: true
  ca_path:
    description: A PEM file of CA certificates to verify the server with.
    type: path
  timeout:
    description: Seconds one HTTP request may take.
    type: int
    default: 30
notes:
  - "Errors of the API fail the task with C(msg) C(E_MIG_<CODE>: message) and C(code), C(status), C(details) apart."
'''
