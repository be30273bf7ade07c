import { runFolder } from './helpers/folder.js'

await runFolder(new URL('./http/', import.meta.url))
