/**
 * Sources: register a vSphere source or a KVM host (`libvirt_remote`: `qemu+ssh://` with a private
 * key and the host's pinned key line) with `POST /sources` (the password or private key goes only
 * to the API, which seals it), test it, list and inspect its VMs, start a warm or cold migration
 * of one.
 */
import { useEffect, useState } from 'preact/hooks'
import type { VmSummary } from '../../../lib/adapters/types.ts'
import type { VmManifest } from '../../../lib/manifest.ts'
import type { Source } from '../../../lib/store/sources.ts'
import { api, ApiError } from '../api.ts'
import { ErrorBox, Head, ManifestView } from '../components.tsx'
import { bytes } from '../format.ts'
import { PlanForm } from '../plan-form.tsx'

/** A source as the API returns it (never with the password). */
type SourceView = Source

/** The kinds the form registers, with their endpoint placeholder. */
const KINDS = {
  vim_api: { label: 'vSphere (vCenter or ESXi)', endpoint: 'https://vcenter.example/sdk' },
  libvirt_remote: { label: 'KVM host (libvirt over SSH)', endpoint: 'qemu+ssh://root@kvm1.example:22/system' },
} as const
type Kind = keyof typeof KINDS

function AddSource({ onAdded }: { onAdded(): void }) {
  const [f, setF] = useState({
    kind: 'vim_api' as Kind,
    name: '',
    endpoint: KINDS.vim_api.endpoint as string,
    username: '',
    password: '',
    thumbprint: '',
    ca_pem: '',
    insecure: false,
    private_key: '',
    known_hosts: '',
  })
  const [err, setErr] = useState<ApiError | null>(null)
  const set = (k: keyof typeof f) => (e: Event) => {
    const t = e.target as HTMLInputElement
    setF({ ...f, [k]: t.type === 'checkbox' ? t.checked : t.value })
  }
  const setKind = (e: Event) => {
    const kind = (e.target as HTMLSelectElement).value as Kind
    // a new kind gets its own endpoint form; typed secrets are dropped
    setF({ ...f, kind, endpoint: KINDS[kind].endpoint, password: '', private_key: '' })
  }
  async function submit(e: Event) {
    e.preventDefault()
    setErr(null)
    try {
      if (f.kind === 'libvirt_remote') {
        await api('POST', '/sources', {
          name: f.name,
          kind: f.kind,
          endpoint: f.endpoint,
          username: f.username,
          private_key: f.private_key,
          known_hosts: f.known_hosts,
          ...(f.insecure ? { tls: { insecure: true } } : {}),
        })
      } else {
        const tls = f.insecure ? { insecure: true } : f.thumbprint ? { thumbprint: f.thumbprint } : f.ca_pem ? { ca_pem: f.ca_pem } : undefined
        await api('POST', '/sources', { name: f.name, kind: f.kind, endpoint: f.endpoint, username: f.username, password: f.password, ...(tls ? { tls } : {}) })
      }
      setF({ ...f, name: '', password: '', private_key: '' })
      onAdded()
    } catch (x) {
      setErr(x as ApiError)
    }
  }
  return (
    <form class="card" onSubmit={submit} data-testid="add-source" autocomplete="off">
      <h3>Register a source</h3>
      <label>
        Kind{' '}
        <select name="kind" value={f.kind} onChange={setKind}>
          {(Object.keys(KINDS) as Kind[]).map((k) => (
            <option key={k} value={k}>
              {KINDS[k].label}
            </option>
          ))}
        </select>
      </label>
      <label>
        Name <input name="name" value={f.name} onInput={set('name')} required />
      </label>
      <label>
        Endpoint <input name="endpoint" value={f.endpoint} onInput={set('endpoint')} required />
      </label>
      <label>
        User <input name="username" value={f.username} onInput={set('username')} required />
      </label>
      {f.kind === 'libvirt_remote' ? (
        <fieldset>
          <legend>SSH</legend>
          <label>
            Private key (OpenSSH, no passphrase) <textarea name="private_key" value={f.private_key} onInput={set('private_key')} rows={3} required />
          </label>
          <label>
            Host key (the line ssh-keyscan prints) <textarea name="known_hosts" value={f.known_hosts} onInput={set('known_hosts')} rows={2} />
          </label>
          <label class="inline">
            <input type="checkbox" name="insecure" checked={f.insecure} onChange={set('insecure')} /> accept any host key (insecure)
          </label>
        </fieldset>
      ) : (
        <>
          <label>
            Password <input name="password" type="password" value={f.password} onInput={set('password')} autocomplete="new-password" />
          </label>
          <fieldset>
            <legend>TLS</legend>
            <label>
              Certificate SHA-256 thumbprint <input name="thumbprint" value={f.thumbprint} onInput={set('thumbprint')} placeholder="AA:BB:…" />
            </label>
            <label>
              or CA certificate (PEM) <textarea name="ca_pem" value={f.ca_pem} onInput={set('ca_pem')} rows={2} />
            </label>
            <label class="inline">
              <input type="checkbox" name="insecure" checked={f.insecure} onChange={set('insecure')} /> accept any certificate (insecure)
            </label>
          </fieldset>
        </>
      )}
      {err && <ErrorBox code={err.code} message={err.message} />}
      <button class="primary" type="submit">
        Register
      </button>
    </form>
  )
}

function SourceCard({ source, onRemoved }: { source: SourceView; onRemoved(): void }) {
  const [test, setTest] = useState<string | null>(null)
  const [vms, setVms] = useState<VmSummary[] | null>(null)
  const [picked, setPicked] = useState<{ vm: VmSummary; manifest: VmManifest } | null>(null)
  const [err, setErr] = useState<ApiError | null>(null)
  const guard = async (fn: () => Promise<void>) => {
    setErr(null)
    try {
      await fn()
    } catch (e) {
      setErr(e as ApiError)
    }
  }
  return (
    <section class="card" data-testid={`source-${source.name}`}>
      <h3>
        {source.name} <span class="muted small">{source.kind}</span>
      </h3>
      <p class="small mono muted">
        {source.endpoint} as {source.username}
        {source.tls.thumbprint ? ` · pinned ${source.tls.thumbprint.slice(0, 23)}…` : ''}
        {source.kind === 'libvirt_remote' && source.known_hosts ? ' · host key pinned' : ''}
        {source.tls.insecure ? (source.kind === 'libvirt_remote' ? ' · any host key (insecure)' : ' · insecure TLS') : ''}
      </p>
      <div class="actions">
        <button onClick={() => guard(async () => setTest(((r) => `${r.product} ${r.version ?? ''}`)(await api<{ product: string; version: string | null }>('POST', `/sources/${source.id}/test`))))}>Test</button>
        <button onClick={() => guard(async () => setVms((await api<{ items: VmSummary[] }>('GET', `/sources/${source.id}/vms`)).items))} data-testid="list-vms">
          List VMs
        </button>
        <button class="danger" onClick={() => guard(async () => (await api('DELETE', `/sources/${source.id}`), onRemoved()))}>
          Remove
        </button>
      </div>
      {test && (
        <p class="ok" data-testid="source-test">
          Connected: {test}
        </p>
      )}
      {err && <ErrorBox code={err.code} message={err.message} />}
      {vms && (
        <table class="grid-table" data-testid="vms">
          <Head cols={['VM', 'Power', 'Guest', 'CPU', 'Memory', '']} />
          <tbody>
            {vms.map((vm) => (
              <tr key={vm.vm_id} data-vm={vm.name}>
                <td>
                  {vm.name} <span class="mono muted small">{vm.vm_id}</span>
                </td>
                <td>{vm.power_state}</td>
                <td>{vm.guest_id ?? '–'}</td>
                <td>{vm.cpu_count ?? '–'}</td>
                <td>{bytes(vm.memory_bytes)}</td>
                <td>
                  <button onClick={() => guard(async () => setPicked({ vm, manifest: await api<VmManifest>('GET', `/sources/${source.id}/vms/${encodeURIComponent(vm.vm_id)}`) }))} data-testid={`inspect-vm-${vm.name}`}>
                    Inspect
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {picked && (
        <div class="two" key={picked.vm.vm_id}>
          <ManifestView kind={source.kind} manifest={picked.manifest} />
          <PlanForm
            base={{ source: { Live: source.kind as Kind }, source_ref: { kind: 'live_vm', source_id: source.id, vm_id: picked.vm.vm_id } }}
            manifest={picked.manifest}
            live={true}
            onSubmitted={(job) => (location.hash = `#/migrations/${job.id}`)}
          />
        </div>
      )}
    </section>
  )
}

/** The page: registered sources, each with test, VM list, inspect and plan; the register form. */
export function SourcesPage() {
  const [sources, setSources] = useState<SourceView[] | null>(null)
  const [err, setErr] = useState<ApiError | null>(null)
  const load = () =>
    api<{ items: SourceView[] }>('GET', '/sources')
      .then((r) => setSources(r.items))
      .catch((e) => setErr(e as ApiError))
  useEffect(() => void load(), [])
  return (
    <section>
      <h2>Sources</h2>
      {err && <ErrorBox code={err.code} message={err.message} />}
      {sources?.map((s) => <SourceCard key={s.id} source={s} onRemoved={() => void load()} />)}
      {sources && sources.length === 0 && <p class="muted">No source registered yet.</p>}
      <AddSource onAdded={() => void load()} />
    </section>
  )
}
