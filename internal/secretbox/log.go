package secretbox

import (
	"fmt"
	"log/slog"
)

// LogResealed reports, once per store at start, what Reseal did there while the key file
// holds more than one key: how many values were re-sealed under the first key and, when every
// value now opens with it, that the other lines can go. what names the store ("registry",
// "pool"). Nothing is logged with a single key; no value and no key is ever logged.
func (b *Box) LogResealed(log *slog.Logger, what string, resealed, unopened int) {
	if b.Keys() < 2 {
		return
	}
	file := b.path
	if file == "" {
		file = "the secrets key file"
	}
	log.Info(what+": re-sealed under the first key of the secrets key file the values that only an older key of it opened",
		"resealed", resealed, "file", file)
	if unopened > 0 {
		log.Warn(fmt.Sprintf("%s: some sealed values open with no key of %s: they stay as they are and fail where they are used; restore the key they were sealed with as a line of the file, or set them again", what, file),
			"unopened", unopened)
		return
	}
	log.Info(fmt.Sprintf("%s: every sealed value opens with the first key of %s: the other lines can be removed", what, file))
}
