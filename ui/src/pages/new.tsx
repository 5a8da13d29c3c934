/**
 * New migration from a file: browse the import root (`GET /host-files`), upload an archive
 * (`POST /uploads`, SHA-256 computed in the browser, streaming, in 8 MiB slices), or name a
 * remote input by its URL (`POST /remote-files/inspect`, docs/remote-sources.md); inspect it,
 * show the manifest, then the plan form.
 */
import { createSHA256 } from 'hash-wasm'
import { useEffect, useState } from 'preact/hooks'
import type { HostFileEntry } from '../../../lib/hostfiles.ts'
import type { VmManifest } from '../../../lib/manifest.ts'
import type { Upload } from '../../../lib/store/uploads.ts'
import { api, ApiError, uploadFile } from '../api.ts'
import { Bar, ErrorBox, ManifestView } from '../components.tsx'
import { bytes, rate } from '../format.ts'
import { PlanForm } from '../plan-form.tsx'

/** An inspected input: where it is (for `source_ref`) and what inspect found. */
interface Inspected {
  ref:
    | { kind: 'offline_host_path'; path: string }
    | { kind: 'upload'; upload_id: string }
    | { kind: 'offline_url'; url: string; credential_id?: string; tls?: { ca_pem: string } }
  label: string
  detected_kind: string
  manifest: VmManifest
}

/** Bytes hashed per slice: the file is read piecewise, never whole. */
const HASH_SLICE = 8 * 1024 * 1024

/** The SHA-256 of `file` (hex), reading it in slices; reports bytes hashed. */
export async function sha256File(file: File, onProgress: (done: number) => void): Promise<string> {
  const h = await createSHA256()
  h.init()
  for (let off = 0; off < file.size; off += HASH_SLICE) {
    h.update(new Uint8Array(await file.slice(off, off + HASH_SLICE).arrayBuffer()))
    onProgress(Math.min(file.size, off + HASH_SLICE))
  }
  return h.digest('hex')
}

function Browser({ onInspect }: { onInspect(path: string): void }) {
  const [dir, setDir] = useState('')
  const [items, setItems] = useState<HostFileEntry[] | null>(null)
  const [truncated, setTruncated] = useState(false)
  const [err, setErr] = useState<ApiError | null>(null)
  useEffect(() => {
    setItems(null)
    setErr(null)
    api<{ items: HostFileEntry[]; truncated: boolean }>('GET', `/host-files?path=${encodeURIComponent(dir)}`)
      .then((r) => {
        setItems(r.items)
        setTruncated(r.truncated)
      })
      .catch((e) => setErr(e as ApiError))
  }, [dir])
  const up = dir.includes('/') ? dir.slice(0, dir.lastIndexOf('/')) : ''
  return (
    <section class="card" data-testid="host-files">
      <h3>
        Import root <span class="mono muted">/{dir}</span>
      </h3>
      {err && <ErrorBox code={err.code} message={err.message} />}
      <table class="grid-table">
        <tbody>
          {dir !== '' && (
            <tr>
              <td colSpan={3}>
                <a href="#" onClick={(e) => (e.preventDefault(), setDir(up))}>
                  ..
                </a>
              </td>
            </tr>
          )}
          {items?.map((f) => (
            <tr key={f.path} data-file={f.path}>
              <td>
                {f.type === 'directory' ? (
                  <a href="#" onClick={(e) => (e.preventDefault(), setDir(f.path))}>
                    📁 {f.name}/
                  </a>
                ) : (
                  <span>{f.name}</span>
                )}
              </td>
              <td class="small muted">{f.type === 'file' ? bytes(f.size_bytes) : f.type}</td>
              <td>
                {f.type !== 'directory' && (
                  <button onClick={() => onInspect(f.path)} data-testid={`inspect-${f.name}`}>
                    Inspect
                  </button>
                )}
                {f.type === 'directory' && (
                  <button onClick={() => onInspect(f.path)} title="inspect the folder (OVF, VMX, VBOX, VMCX folders)">
                    Inspect folder
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {items && items.length === 0 && <p class="muted">Empty. Copy exports here (SCP, NFS, SMB) or upload one.</p>}
      {truncated && <p class="muted">Only the first entries are listed.</p>}
    </section>
  )
}

function Uploader({ onUploaded }: { onUploaded(u: Upload): void }) {
  const [phase, setPhase] = useState<'idle' | 'hashing' | 'uploading' | 'done'>('idle')
  const [done, setDone] = useState(0)
  const [total, setTotal] = useState(0)
  const [speed, setSpeed] = useState(0)
  const [err, setErr] = useState<ApiError | null>(null)
  const [sha, setSha] = useState('')
  async function pick(e: Event) {
    const file = (e.target as HTMLInputElement).files?.[0]
    if (!file) return
    setErr(null)
    setTotal(file.size)
    setDone(0)
    setPhase('hashing')
    try {
      const digest = await sha256File(file, setDone)
      setSha(digest)
      setPhase('uploading')
      setDone(0)
      const t0 = performance.now()
      const up = await uploadFile<Upload>(file, digest, (sent) => {
        setDone(sent)
        setSpeed(sent / Math.max(0.001, (performance.now() - t0) / 1000))
      })
      setPhase('done')
      onUploaded(up)
    } catch (x) {
      setPhase('idle')
      setErr(x instanceof ApiError ? x : new ApiError('E_CONSOLE', String(x), 0))
    }
  }
  return (
    <section class="card" data-testid="uploader">
      <h3>Upload an export</h3>
      <input type="file" onChange={pick} disabled={phase === 'hashing' || phase === 'uploading'} data-testid="upload-input" />
      {phase !== 'idle' && (
        <div data-testid="upload-progress" data-phase={phase}>
          <div class="small">
            {phase === 'hashing' ? 'Computing SHA-256 in the browser' : phase === 'uploading' ? 'Uploading' : 'Uploaded'}: {bytes(done)} of {bytes(total)}
            {phase === 'uploading' && speed > 0 ? `, ${rate(speed)}` : ''}
          </div>
          <Bar done={phase === 'done' ? total : done} total={total} state={phase === 'done' ? 'Completed' : undefined} />
          {sha && <div class="small mono muted">sha256 {sha}</div>}
        </div>
      )}
      {err && <ErrorBox code={err.code} message={err.message} />}
    </section>
  )
}

/** A remote input's reference as the form spells it: `offline_url` with its optional credential and CA. */
type UrlRef = { kind: 'offline_url'; url: string; credential_id?: string; tls?: { ca_pem: string } }

/**
 * The URL form: an http(s)://, s3:// or smb://server/share/file URL, a registered credential (`GET /remote-credentials`,
 * never a secret) and an optional CA certificate (PEM) to trust.
 */
function RemoteUrl({ onInspect }: { onInspect(ref: UrlRef): void }) {
  const [url, setUrl] = useState('')
  const [credential, setCredential] = useState('')
  const [caPem, setCaPem] = useState('')
  const [credentials, setCredentials] = useState<Array<{ id: string; name: string; kind: string }>>([])
  useEffect(() => {
    api<{ items: Array<{ id: string; name: string; kind: string }> }>('GET', '/remote-credentials')
      .then((r) => setCredentials(r.items))
      .catch(() => setCredentials([]))
  }, [])
  return (
    <section class="card" data-testid="remote-url">
      <h3>From a URL</h3>
      <form
        onSubmit={(e) => {
          e.preventDefault()
          onInspect({
            kind: 'offline_url',
            url: url.trim(),
            ...(credential ? { credential_id: credential } : {}),
            ...(caPem.trim() ? { tls: { ca_pem: caPem.trim() } } : {}),
          })
        }}
      >
        <label>
          URL (https://, http://, s3:// or smb://)
          <input data-testid="remote-url-input" type="text" value={url} placeholder="https://files.example.org/vm.ova" onInput={(e) => setUrl((e.target as HTMLInputElement).value)} />
        </label>
        <label>
          Credential
          <select data-testid="remote-credential" value={credential} onChange={(e) => setCredential((e.target as HTMLSelectElement).value)}>
            <option value="">none</option>
            {credentials.map((c) => (
              <option key={c.id} value={c.id}>
                {c.name} ({c.kind})
              </option>
            ))}
          </select>
        </label>
        <label>
          CA certificate (PEM, optional)
          <textarea data-testid="remote-ca" rows={3} value={caPem} onInput={(e) => setCaPem((e.target as HTMLTextAreaElement).value)} />
        </label>
        <button type="submit" data-testid="remote-inspect" disabled={url.trim() === ''}>
          Inspect
        </button>
      </form>
    </section>
  )
}

/** The page: pick a host file, upload one or name a URL, inspect, plan. */
export function NewMigrationPage() {
  const [inspected, setInspected] = useState<Inspected | null>(null)
  const [busy, setBusy] = useState<string | null>(null)
  const [err, setErr] = useState<ApiError | null>(null)
  async function inspect(label: string, ref: Inspected['ref'], call: () => Promise<{ detected_kind: string; manifest: VmManifest }>) {
    setInspected(null)
    setErr(null)
    setBusy(label)
    try {
      const r = await call()
      setInspected({ ref, label, ...r })
    } catch (e) {
      setErr(e as ApiError)
    } finally {
      setBusy(null)
    }
  }
  return (
    <section>
      <h2>New migration from a file</h2>
      <div class="two">
        <Browser onInspect={(path) => void inspect(path, { kind: 'offline_host_path', path }, () => api('POST', '/host-files/inspect', { path }))} />
        <Uploader onUploaded={(u) => void inspect(u.filename, { kind: 'upload', upload_id: u.id }, () => api('POST', `/uploads/${u.id}/inspect`))} />
      </div>
      <RemoteUrl
        onInspect={(ref) => {
          const { kind: _kind, ...body } = ref
          void inspect(ref.url, ref, () => api('POST', '/remote-files/inspect', body))
        }}
      />
      {busy && <p class="muted">Inspecting {busy}…</p>}
      {err && <ErrorBox code={err.code} message={err.message} />}
      {inspected && (
        <div class="two" key={inspected.label}>
          <ManifestView kind={inspected.detected_kind} manifest={inspected.manifest} />
          <PlanForm
            base={{ source: { Offline: inspected.detected_kind as never }, source_ref: inspected.ref }}
            manifest={inspected.manifest}
            live={false}
            onSubmitted={(job) => (location.hash = `#/migrations/${job.id}`)}
          />
        </div>
      )}
    </section>
  )
}
