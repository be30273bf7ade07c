import { runFolder } from './helpers/folder.js'

await runFolder(new URL('./lists/', import.meta.url))
