//! The built-in reference model: a small English text corpus, written once to the data directory.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;

/// The text of the built-in `reference` model: varied English sentences written for this
/// project (no third-party text), about three kilobytes.
pub const REFERENCE_CORPUS: &str = "\
The river runs past the old mill and into the quiet forest where the deer drink at dawn. \
In the morning the village wakes slowly, and the baker lights the oven before the sun is up. \
A small boat waits by the stone bridge, and the fisherman counts his nets with patient hands. \
The forest is green in summer and gold in autumn, and the wind carries the smell of pine. \
Children run along the path to the school, laughing at the geese that guard the pond. \
The teacher writes a long sentence on the board and asks the children to read it aloud. \
Every word has a sound, every sound has a shape, and every shape can be drawn with care. \
The old clock in the tower strikes nine, and the market fills with voices and bright colors. \
Apples and pears are piled high, the cheese is cut in thick slices, and the bread is warm. \
A traveler from the north asks the way to the harbor, and a girl points toward the hill. \
Beyond the hill the sea is calm, the gulls circle above the ships, and the sailors sing. \
The lighthouse keeper climbs the stairs each evening to light the lamp for the night. \
When the storm comes the waves rise against the rocks, and the village closes its shutters. \
After the storm the air is clean, the sky is wide, and the river runs faster than before. \
The farmer walks the field at noon and looks at the wheat that bends in the warm wind. \
He knows the weather by the color of the clouds and the flight of the swallows. \
His daughter reads books about distant cities, tall towers, and trains that cross the plains. \
One day she will take the train herself and see the mountains covered in snow. \
The mountains are silent in winter, and the paths are hidden under a deep white blanket. \
A fox crosses the snow at night, leaving small tracks that lead into the dark forest. \
In the spring the snow melts, the streams wake up, and the valley turns green again. \
The bees return to the flowers, the birds build their nests, and the days grow long. \
A painter sets up his easel by the river and tries to catch the light on the water. \
He paints the bridge, the mill, the boat, and the fisherman who never seems to move. \
The light changes every minute, so the painter works quickly and speaks to no one. \
In the evening the village gathers in the square to hear music and share a simple meal. \
An old woman tells a story about a lost key, a locked door, and a garden behind the wall. \
The children listen with wide eyes, and the fire throws long shadows on the stones. \
Nobody knows if the story is true, but everyone agrees that the garden must be beautiful. \
Late at night the stars come out over the forest, and the owls call from the tall trees. \
The river keeps running in the dark, past the mill, under the bridge, and down to the sea. \
Tomorrow the baker will light the oven again, and the village will wake slowly once more. \
A good day begins with warm bread, clear water, kind words, and a little time to think. \
The library on the hill holds old maps, quiet rooms, and a window that faces the sea. \
Students come to the library to learn about stars, rivers, numbers, and the names of things. \
The librarian believes that every question deserves an answer and every answer a new question. \
So the days pass in the village by the river, one after another, simple and full of light.
";

/// Writes [`REFERENCE_CORPUS`] to `path` if, and only if, no file exists there yet; returns
/// whether it wrote it. An existing file is never touched (whatever its contents); a file this
/// call created but could not finish writing is removed again. Creates missing parent
/// directories.
pub fn write_reference_corpus(path: &Path) -> io::Result<bool> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)?;
        }
    }
    let mut file = match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(error) => return Err(error),
    };
    let written = file
        .write_all(REFERENCE_CORPUS.as_bytes())
        .and_then(|()| file.sync_all());
    match written {
        Ok(()) => Ok(true),
        Err(error) => {
            drop(file);
            // The file is ours (created just now): do not leave a truncated corpus behind.
            let _ = std::fs::remove_file(path);
            Err(error)
        }
    }
}
